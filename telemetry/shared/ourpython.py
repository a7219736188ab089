"""How our tools start a Python process of ours (`python -m telemetry daemon`, `-m trainer.launch`).

`python -m` puts the working directory first on the new process's sys.path. A user's working
directory holds `./telemetry/<run id>/` (the default run directory) or a `trainer/` of its own; with
this project installed editable (an import hook, found after the path), that directory would be
imported as our package (a namespace package: "cannot import name ... from 'telemetry'"). The
command below drops the working directory, imports the package, then puts the directory back at the
end of sys.path, so a custom sink or module beside the user's script is still found, but never in
place of ours.
"""
from __future__ import annotations

import sys

_BOOT = ("import runpy, sys; d = sys.path.pop(0); import {pkg}; sys.path.append(d); "
         "runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")


def module_cmd(module: str) -> list[str]:
    """The argv that runs `python -m module` with our package imported from where it is installed;
    the module's own arguments follow it."""
    pkg = module.partition(".")[0]
    return [sys.executable, "-c", _BOOT.format(pkg=pkg, module=module)]
