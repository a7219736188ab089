import sys

from telemetry.cli import main

sys.exit(main())
