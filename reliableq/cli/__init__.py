"""The `reliableq` command, one module per family of commands, and `main` (the parser, in main.py).

    main        the parser and main(): one line for people on an error, the traceback with --debug
    arguments   what the families share: argument types, the --off switch, UsageError, running a coroutine
    logs        the level each command logs at, text or JSON lines, the driver's reconnect noise summarised
    database    db, migrate
    services    api, charge-service, worker
    operators   submit, jobs, replay
    lab         demo, stage, lab, chaos
    doctor      doctor: a learner's machine checked before a workshop, a line per check
    bench       bench

`main` is named here because the installed `reliableq` script (pyproject's `reliableq.cli:main`) calls
it; nothing else is exported.
"""

from reliableq.cli.main import main

__all__ = ["main"]
