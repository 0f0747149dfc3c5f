"""The ``gradpipe`` command line.

``plugins``, ``describe`` and ``check`` never import TensorFlow, so they answer in well
under a second; ``run`` and ``check --plan`` import it only once the file is
known to be valid.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import textwrap
from collections.abc import Sequence

from .cli_args import parse_shapes, pipeline_file, with_shapes_hint
from .errors import ConfigError, GradpipeError
from .run_command import add_run_parser, import_tensorflow_quietly
from .serve import add_serve_parser


def main(argv: Sequence[str] | None = None) -> int:
    return _run(argv)[0]


def entry() -> None:
    """The ``gradpipe`` console script: :func:`main`, then the process's exit.

    A command that only reads and prints (``check``, ``schedule``, ``from-keras``)
    leaves nothing to release once it has answered, but an interpreter that imported
    TensorFlow spends 0.5-0.7 s tearing it down on exit (2 cores; about 15% of a
    ``check --plan`` of 50 x 400k floats). Such a command ends the
    process at once, its output flushed; the others (``run``, ``serve``) exit as
    usual, since a run's distributed peers and files may wait on a clean shutdown.
    """
    code, args = _run(None)
    if getattr(args, "answers_only", False) and "tensorflow" in sys.modules:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BrokenPipeError, ValueError):  # `| head`, or closed
                stream.flush()
        os._exit(code)
    sys.exit(code)


def _run(argv: Sequence[str] | None) -> tuple[int, argparse.Namespace]:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2, args
    return _dispatch(args), args


def _dispatch(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args))
    except ConfigError as exc:
        if getattr(args, "json", False):
            print(json.dumps({"ok": False, "errors": exc.as_dicts()}, indent=2))
        else:
            print(f"error: {len(exc.problems)} problem(s) in the pipeline:", file=sys.stderr)
            print(str(exc), file=sys.stderr)
        return 1
    except GradpipeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `gradpipe describe adam | head`: the reader has gone
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gradpipe", description="Validated gradient pipelines for TensorFlow.")
    sub = parser.add_subparsers(dest="command")

    p = sub.add_parser("plugins", help="list installed plugins and their components")
    p.add_argument("--all", action="store_true", help="include built-in plugins")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--hook", metavar="NAME", help="only plugins implementing this hook")
    p.add_argument("--traceback", action="store_true",
                   help="print the full traceback of each plugin that failed "
                        "(also GRADPIPE_PLUGIN_TRACEBACKS=1)")
    p.set_defaults(func=cmd_plugins)

    p = sub.add_parser("describe", help="show a component's keys: type, default, valid "
                                        "range and meaning")
    p.add_argument("kind_word", nargs="?", metavar="KIND",
                   help="the component's kind, when the name alone is ambiguous "
                        "(transform adam)")
    p.add_argument("name", metavar="NAME", help="the component's name: adam, or dist>name")
    p.add_argument("--kind", help="the component's kind: transform, loss_scale, schedule, "
                                  "convergence, placement or problem")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_describe)

    p = sub.add_parser("check", help="validate a pipeline file")
    p.add_argument("file", metavar="FILE", type=pipeline_file)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--resolved", action="store_true",
                   help="print only the resolved TOML (defaults and [lock] filled in)")
    p.add_argument("--plan", action="store_true",
                   help="build the pipeline (imports TensorFlow) and print how its step "
                        "runs, with a reason for each choice")
    # Either one only means something to a plan, so it asks for one: ignoring it
    # would print the resolved file and say nothing of the shapes given.
    variables = p.add_mutually_exclusive_group()
    variables.add_argument("--problem", help="plan for this problem's variables (implies "
                                             "--plan; default: the file's [problem])")
    variables.add_argument("--shapes", metavar="SHAPES",
                           help="plan for float32 variables of these shapes (implies "
                                "--plan), e.g. 784x256,256,256x10,10; SHAPE*N is N "
                                "variables of one shape: 800x500*50; NAME=SHAPE names "
                                "one for variables/exclude patterns: dense/bias=256")
    p.set_defaults(func=cmd_check, answers_only=True)

    p = sub.add_parser("schedule", help="evaluate (and plot) the schedules of a file")
    p.add_argument("file", metavar="FILE", type=pipeline_file)
    p.add_argument("--name", help="only this schedule (a [schedules] name or a key path)")
    p.add_argument("--steps", type=int, required=True, help="evaluate steps 0..S-1")
    p.add_argument("--csv", action="store_true", help="print step,value columns")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--plot", metavar="PNG", help="draw every schedule to this PNG file")
    p.add_argument("--log", action="store_true", help="logarithmic value axis in the plot")
    p.set_defaults(func=cmd_schedule, answers_only=True)

    p = sub.add_parser("new-plugin", help="write a ready-to-install plugin package")
    p.add_argument("name", help="plugin name; the distribution is gradpipe-NAME")
    p.add_argument("--component", action="append", default=[], metavar="NAME",
                   help="a transform of the plugin, with its test and index entry "
                        "(repeatable; default: one named like the plugin)")
    p.add_argument("--rule", action="append", default=[], metavar="NAME",
                   help="an update rule of the plugin (state, step count, bias "
                        "correction), with its test and index entry (repeatable)")
    p.add_argument("--directory", default=".", help="where to create it (default: here)")
    p.set_defaults(func=cmd_new_plugin)

    p = sub.add_parser("from-keras", help="write the pipeline of a Keras 3 optimizer as TOML")
    p.add_argument("config", help="JSON of keras.optimizers.serialize(optimizer), a model "
                                  "config with a compile_config, or a .keras file")
    p.add_argument("-o", "--output", metavar="TOML",
                   help="write the pipeline file here (default: print it)")
    p.set_defaults(func=cmd_from_keras, answers_only=True)

    add_run_parser(sub)
    add_serve_parser(sub)
    return parser


def cmd_plugins(args: argparse.Namespace) -> int:
    from .entry_points import KIND_HOOKS, env_flag, index_problems
    from .registry import get_registry

    registry = get_registry().load_all()
    full = args.traceback or env_flag("GRADPIPE_PLUGIN_TRACEBACKS")
    records = [r for r in registry.plugins if args.all or not r.builtin]
    if args.hook:
        from .hints import did_you_mean

        if args.hook not in KIND_HOOKS.values():
            raise GradpipeError(f"unknown hook {args.hook!r}"
                                f"{did_you_mean(args.hook, KIND_HOOKS.values())}; hooks: "
                                f"{', '.join(KIND_HOOKS.values())}")
        records = [r for r in records if args.hook in r.hooks]
    if args.json:
        print(json.dumps([r.as_dict() for r in records], indent=2))
        return 0
    if not records:
        print("no third-party plugins installed (use --all to list the built-ins)")
        return 0
    for r in records:
        status = r.status if r.status == "loaded" else f"{r.status.upper()}: {r.error}"
        print(f"{r.provider.dist} {r.provider.version}  entry point {r.provider.entry_point!r}"
              f"  [{status}]  ({r.import_seconds * 1000:.1f} ms)")
        for kind, names in sorted(r.components.items()):
            print(f"    {kind:12s} {', '.join(names)}")
        if r.status == "loaded" and not r.builtin:
            provided = {(kind, name) for other in registry.plugins
                        if other.provider.dist == r.provider.dist
                        for kind, names in other.components.items() for name in names}
            for problem in index_problems("gradpipe.components", r.provider.dist, provided):
                print(f"    warning: {problem}")
        if r.status == "failed":
            if r.location:
                print(f"    at {r.location}")
            if r.traceback and full:
                print(textwrap.indent(r.traceback.rstrip(), "    | "))
            print(f"    fix: upgrade or uninstall {r.provider.dist}, or set "
                  f"GRADPIPE_DISABLED_PLUGINS={r.provider.entry_point}"
                  + ("" if full else "; --traceback shows the full traceback"))
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    from .describe import describe, find_component, format_text
    from .registry import get_registry

    kind = args.kind_word or args.kind
    if args.kind_word and args.kind and args.kind_word != args.kind:
        raise GradpipeError(f"kind {args.kind_word!r} and --kind {args.kind!r} disagree")
    registry = get_registry()
    info = describe(find_component(registry, args.name, kind), registry)
    print(json.dumps(info, indent=2) if args.json else format_text(info))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from .api import parse

    spec = parse(args.file)
    if args.plan and not (args.problem or args.shapes) and spec.problem is None:
        # a usage error, found before TensorFlow is imported: the file is valid
        print("gradpipe check: error: --plan needs variables to plan for: the file has no "
              "[problem]; pass --shapes (784x256,256,256x10,10) or --problem (quadratic)",
              file=sys.stderr)
        return 2
    if args.plan or args.problem or args.shapes:
        from .runner import plan_problem

        shapes = parse_shapes(args.shapes) if args.shapes else None
        import_tensorflow_quietly(spec)
        try:
            plan = plan_problem(spec, problem=args.problem, shapes=shapes)
        except ConfigError as exc:
            raise with_shapes_hint(exc, shapes) from None
        print(json.dumps({"ok": True, "plan": plan}, indent=2) if args.json else plan)
    elif args.json:
        print(json.dumps({"ok": True, "pipeline": spec.to_mapping()}, indent=2))
    elif args.resolved:
        print(spec.to_toml(), end="")
    else:
        print(f"# {args.file}: OK. Resolved pipeline, defaults filled in:")
        print(spec.to_toml(), end="")
    return 0


def cmd_schedule(args: argparse.Namespace) -> int:
    from .api import parse
    from .schedule_eval import evaluate, plot

    if args.steps < 1:
        raise GradpipeError(f"--steps must be at least 1, got {args.steps}")
    spec = parse(args.file)
    import_tensorflow_quietly()
    series = evaluate(spec, args.steps, args.name)
    if args.plot:
        plot(series, args.plot, title=f"schedules of {args.file}", log=args.log)
        print(f"wrote {args.plot}", file=sys.stderr)
    labels = list(series)
    if args.json:
        print(json.dumps({"steps": list(range(args.steps)), "schedules": series}))
    elif args.csv:
        print(",".join(["step", *labels]))
        for i in range(args.steps):
            print(",".join([str(i), *(repr(series[k][i]) for k in labels)]))
    elif not args.plot:
        picks = sorted({round(i * (args.steps - 1) / 10) for i in range(11)})
        width = max(12, *(len(k) for k in labels))
        print("step".rjust(8) + "".join(k.rjust(width + 2) for k in labels))
        for i in picks:
            print(str(i).rjust(8) + "".join(f"{series[k][i]:.6g}".rjust(width + 2)
                                            for k in labels))
    return 0


def cmd_from_keras(args: argparse.Namespace) -> int:
    from .from_keras import pipeline_toml
    from .keras_saving import read_optimizer_config, saved_pipeline_toml

    data = read_optimizer_config(args.config)
    # A model compiled with pipe.keras_optimizer() holds its pipeline's TOML: no Keras
    # (and no TensorFlow) is needed to print it.
    if saved_pipeline_toml(data, args.config) is None:
        import_tensorflow_quietly()
    text = pipeline_toml(args.config, data)
    if args.output:
        with open(args.output, "w") as out:
            out.write(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(text, end="")
    return 0


def cmd_new_plugin(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .registry import get_registry
    from .template import component_names, new_plugin

    root = new_plugin(args.name, Path(args.directory), args.component, args.rule)
    # pip reads "gradpipe-x[test]" as a package on the index; "./" makes it the folder.
    where = str(root) if root.is_absolute() else f"./{root}"
    print(f"wrote {root}; next:\n  python -m pip install -e \"{where}[test]\" && "
          f"python -m pytest {where}/tests")
    _, transforms, rules = component_names(args.name, args.component, args.rule)
    existing = set(get_registry().names("transform"))
    for name in (n for n in transforms + rules if n in existing):
        print(f"note: transform {name!r} already exists; while both are installed a "
              f"pipeline must write 'gradpipe>{name}' or '{root.name}>{name}'. "
              "Rename the component in the generated module to avoid that.")
    return 0


if __name__ == "__main__":  # pragma: no cover
    entry()
