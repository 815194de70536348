"""`make demo` as a report: the main job's phases with their times, then what they left in the lake.

    python -m factory.demo [--home PATH] [--experiment smoke]    # what `make demo` runs after setup

`runner.py` runs the phases (the Dagster CLI and `factory` commands, as child processes),
`steps.py` sorts each command's output into the terminal (the factory's progress) and a log file
(everything else), `summary.py` reads the lake back for the closing summary.
"""
