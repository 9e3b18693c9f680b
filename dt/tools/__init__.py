"""The `dt` command: cli.py routes `dt <command>` to one module per command.

demo.py (`dt demo`), tune.py (`dt tune`), whatif.py (`dt model`); `dt train`
lives in dt/train and `dt bench` in dt/bench.
"""
