"""Run `dagster` CLI commands one after another in one process (what `make demo` runs its Dagster
phases through): `python jobs/cli_session.py MARKER`, then one command per stdin line.

Each line is the argument list of one `dagster` command as a JSON list (`["asset", "materialize",
"-m", "definitions", "--select", "mix", "--partition", "default"]`), run by the same click group the
`dagster` console script runs, with its environment prefix: each command makes the same Dagster
run, with the same tags and events, as when it is typed in a shell. After each command the session
prints `MARKER <exit status>` on a line of its own (the caller picks a marker no output can hold),
so the caller can tell one command's output from the next; it ends at the end of its input.

Why: every `dagster` process imports the code location — Dagster, every asset module, torch,
pandas, Spark's Python side — before it runs anything, and `make demo` ran seven of them; here the
import happens once. Later commands also find what earlier ones started in the process: the vLLM
engine the eval opened serves the synthetic pipeline's model stage (`factory.infer.open_engine`
keeps one per process), the SparkSession of the refinement runs stays up.

Run by path like `add_partitions.py`, so it imports nothing before the first command asks.
"""

import json
import sys
import traceback


def run(args: list[str]) -> int:
    """One `dagster` command in this process; its exit status as the console script would exit."""
    import click
    from dagster._cli import ENV_PREFIX, cli

    try:
        result = cli.main(args=args, prog_name="dagster", auto_envvar_prefix=ENV_PREFIX, standalone_mode=False)
    except click.ClickException as e:  # "Materialization failed.", a bad option: what click prints and exits with
        e.show()
        return e.exit_code
    except click.Abort:
        print("Aborted!", file=sys.stderr)
        return 1
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except Exception:  # the console script would die with this traceback
        traceback.print_exc()
        return 1
    return result if isinstance(result, int) else 0  # standalone_mode=False returns a ctx.exit() status


def main(argv: list[str]) -> int:
    marker = argv[0]
    for line in sys.stdin:
        if not line.strip():
            continue
        code = run(json.loads(line))
        sys.stderr.flush()
        print(f"{marker} {code}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
