"""Every benchmark script at its quick sizes, in one process, so that none rots.

    python benchmarks/_smoke.py [SCRIPT ...]

What the test suite runs: each script's ``main`` with ``--quick`` (tiny sizes,
few rounds), which prints its tables. No timing is checked: the point is that
every case of every script still runs. One process imports TensorFlow once for
all of them; the benchmarks' plugin is installed first, so that gradpipe's
registry finds it when it loads. Exits 1 naming the scripts that failed.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import sys
import time
import traceback

from _plugin import installed_plugin

# --small and --rule sgd without their XLA cases: the first run runs that code
RUNS = [("step", []), ("step", ["--small", "--no-xla"]), ("step", ["--rule", "sgd", "--no-xla"]),
        ("fit", []), ("startup", []), ("memory", []),
        ("first_step", ["--models", "dense,classifier"]),
        ("rules", []), ("thirdparty", []), ("compare", []), ("catalog", []),
        ("embedding_fit", []), ("parameter_server", [])]


def run(name: str, extra: list[str]) -> str:
    """Run one script's ``main``; "" if it ran and printed a table, else why not."""
    module = importlib.import_module(name)
    printed = io.StringIO()
    sys.argv = [f"{name}.py", *extra, "--quick"]
    try:
        with contextlib.redirect_stdout(printed):
            code = module.main()
    except SystemExit as exc:
        code = exc.code
    except Exception:
        return traceback.format_exc()
    finally:
        with contextlib.suppress(ImportError):  # a script may set a global policy
            import keras

            keras.mixed_precision.set_global_policy("float32")
    if code not in (0, None):
        return f"exited {code}\n{printed.getvalue()[-2000:]}"
    return "" if "----" in printed.getvalue() else f"printed no table:\n{printed.getvalue()}"


def main() -> int:
    wanted = sys.argv[1:]
    failed = []
    with installed_plugin():
        for name, extra in RUNS:
            if wanted and name not in wanted:
                continue
            start = time.perf_counter()
            why = run(name, extra)
            label = " ".join([f"{name}.py", *extra])
            print(f"{label}: {'ok' if not why else 'FAILED'} "
                  f"({time.perf_counter() - start:.1f} s)", flush=True)
            if why:
                failed.append(f"{label}: {why}")
    print("\n\n".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
