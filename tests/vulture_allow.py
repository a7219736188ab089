"""Names the dead-code finder (vulture, tests/test_dead_code.py) cannot see used: each is used by
name from outside the product's code. A line here says who uses it; anything else vulture finds
is dead and goes.

Not a module anyone imports: vulture reads it as code that uses these names.
"""
# ruff: noqa
_ = None

# Module-level __getattr__ (PEP 562): Python calls it for a missing attribute.
__getattr__  # protocol/__init__.py, telemetry/__init__.py, telemetry/wandb.py, integrations/lightning.py, as_wandb

# argparse and socketserver read these attributes of objects we configure.
_.description, _.formatter_class                                  # argparse.ArgumentParser (cli.py)
_._print_message                                                  # argparse prints --help, --version, usage with it (cli.Parser)
_.daemon_threads, _.allow_reuse_address, _.handle_error              # socketserver.ThreadingMixIn / TCPServer
_.protocol_version, _.log_message, _.close_connection, _.do_HEAD, _.do_POST  # http.server.BaseHTTPRequestHandler
_.request_queue_size                                              # socketserver.TCPServer's listen backlog

# atexit runs it.
_close_all  # telemetry/client/core.py

# ZeroMQ socket options set as attributes (pyzmq: sock.curve_secretkey = ... is setsockopt).
_.curve_secretkey, _.curve_publickey, _.curve_serverkey, _.zap_domain
# pyzmq's zmq.auth.Authenticator calls curve_user_id for a key's User-Id and reads allow_any.
_.curve_user_id, _.allow_any

# What other frameworks call on our integrations (their hooks and class attributes).
TelemetryTracker, _.requires_logging_directory, _.main_process_only   # Accelerate's GeneralTracker
_.store_init_configuration, _.log_images, _.log_table                 # Accelerate calls / users call
TelemetryCallback, _.on_train_begin, _.on_step_begin, _.on_step_end, _.on_log, _.on_save, _.on_evaluate, _.on_train_end  # transformers
_.on_epoch_begin, _.on_epoch_end, _.on_prediction_step               # transformers' TrainerCallback (hf.py's timing)
_.log_hyperparams, _.log_metrics, _.finalize                          # Lightning's Logger
_.on_train_start, _.on_train_batch_start, _.on_train_batch_end, _.on_validation_start, _.on_validation_end  # Lightning's Callback
RunDisabled                                                           # Lightning's WandbLogger imports it from wandb.sdk.lib

# W&B's API, kept by the drop-in for scripts and integrations (their signatures too).
_.setdefaults, _.offline, _.disabled, _._label                        # wandb config / run
overwrite, save_code, anonymous, magic                                # wandb.init / define_metric arguments
is_tmp, skip_cache, merge                                             # wandb.Artifact.add_file / add_dir arguments
_.WARN, _.new_file, _.upsert_artifact, _.project_url                  # wandb.AlertLevel.WARN, Artifact.new_file, run.upsert_artifact, run.project_url
context                                                               # wandb.sdk.lib.telemetry.context: integrations run under the drop-in call it

# The harness and the benchmarks: called by name, or a fake's signature.
_.overhead          # benchmarks/gpu/bench.py runs its parts by name (--parts overhead,...)
UNKNOWN             # testkit/fake_nvml.py: an NVML error code tests/test_pollers_nvml.py raises
sensor, counter_type, event_types   # testkit/fake_nvml.py: pynvml's signatures
_.screenshot, _.get_json, stop_with_daemon   # testkit/cdp.py, testkit/dashboard_proc.py: the dashboard's tests call them
_.group_tree, _.multinode_straggler   # testkit/faults.py: tests/test_multinode_groups.py and test_multinode_straggler.py run them
GOOD_HOSTS, EVIL_HOSTS   # testkit/hosts.py: the Host tables the dashboard's and the exporter's tests read
NodeTree, _.restart_head   # testkit/faults.py: tests/test_multinode_links.py, _clock.py, _head_restart.py
_.samples           # testkit/victoria_metrics.py: tests/test_otlp_victoriametrics.py reads a series' samples
MeasuredOtlpSink    # benchmarks/otlp_fleet.py: its node daemons load it by name (custom_sinks' class)

# The trainer: a framework's signatures, a model config field, a reserved token id.
worker_id           # torch DataLoader worker_init_fn(worker_id)
closure             # torch.optim.Optimizer.step(closure=None)
_.use_cache         # transformers model config (generation off while training)
PAD_ID              # trainer/data.py: the byte vocabulary's reserved ids, named together

# W&B's Run attributes a script reads by name (the drop-in's run, telemetry/integrations/wandb_run.py).
_.sweep_id, _.sweep_url, _.starting_step, _.sync_dir
