"""Generate docs/coming-from-tf-addons.md from the registry.

    python docs/gen_tfa_page.py            # rewrite the page
    python docs/gen_tfa_page.py --check    # exit 1 if the page is stale

TF Addons does not import on TensorFlow 2.21, so its classes' arguments and
defaults are written below as its ``__init__`` signatures give them. Every
gradpipe side is asked of the registry: each table is parsed as a pipeline,
each key named must be a key of that component, and its default is read from
the component's config class, so a renamed key or a changed default fails the
docs test until this file says so.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, NamedTuple

import attrs
import tomli_w
from _generated import write_or_check

import gradpipe
from gradpipe.registry import get_registry

PAGE = Path(__file__).parent / "coming-from-tf-addons.md"
REQUIRED = object()


class Entry(NamedTuple):
    tfa: str  # the class, in tfa.optimizers
    arguments: dict[str, Any]  # its __init__ arguments and defaults (REQUIRED: none)
    transforms: list[dict[str, Any]]  # the gradpipe chain; RULE stands for any rule
    keys: dict[str, str]  # argument -> "kind.key[, ...] [remark]", "- why not", or text


def rule(kind: str) -> dict[str, Any]:
    return {"kind": kind}


NO = "- no such option"
WARMUP = "a `learning_rate` schedule (below)"
EXCLUDE = "`exclude = [regex, ...]` on `weight_decay` (`variables` for `decay_var_list`)"
RULE = {"kind": "adam"}  # "any rule" in the wrappers' tables
OPTIMIZERS = [
    Entry("AdaBelief", {"learning_rate": 0.001, "beta_1": 0.9, "beta_2": 0.999,
                        "epsilon": 1e-14, "weight_decay": 0.0, "amsgrad": False,
                        "rectify": True, "sma_threshold": 5.0, "total_steps": 0,
                        "warmup_proportion": 0.1, "min_lr": 0.0},
          [{"kind": "adabelief", "epsilon": 1e-14, "epsilon_root": 1e-14}],
          {"learning_rate": "adabelief.learning_rate", "beta_1": "adabelief.beta_1",
           "beta_2": "adabelief.beta_2",
           "epsilon": "adabelief.epsilon, adabelief.epsilon_root",
           "weight_decay": "adabelief.weight_decay", "amsgrad": NO, "rectify": NO,
           "sma_threshold": "- with `rectify` only", "total_steps": WARMUP,
           "warmup_proportion": WARMUP, "min_lr": WARMUP}),
    Entry("COCOB", {"alpha": 100}, [rule("cocob")], {"alpha": "cocob.alpha"}),
    Entry("ConditionalGradient", {"learning_rate": REQUIRED, "lambda_": 0.01,
                                  "epsilon": 1e-7, "ord": "fro"},
          [{"kind": "conditional_gradient", "learning_rate": 0.1}],
          {"learning_rate": "conditional_gradient.learning_rate",
           "lambda_": "conditional_gradient.lambda_",
           "epsilon": "conditional_gradient.epsilon", "ord": "conditional_gradient.ord"}),
    Entry("LAMB", {"learning_rate": 0.001, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-6,
                   "weight_decay": 0.0, "exclude_from_weight_decay": None,
                   "exclude_from_layer_adaptation": None},
          [{"kind": "lamb", "epsilon": 1e-6}],
          {"learning_rate": "lamb.learning_rate", "beta_1": "lamb.beta_1",
           "beta_2": "lamb.beta_2", "epsilon": "lamb.epsilon",
           "weight_decay": "- decay inside the trust ratio (below)",
           "exclude_from_weight_decay": "- with `weight_decay` only",
           "exclude_from_layer_adaptation": NO}),
    Entry("LazyAdam", {"learning_rate": 0.001, "beta_1": 0.9, "beta_2": 0.999,
                       "epsilon": 1e-7, "amsgrad": False},
          [{"kind": "adam", "lazy": True}],
          {"learning_rate": "adam.learning_rate", "beta_1": "adam.beta_1",
           "beta_2": "adam.beta_2", "epsilon": "adam.epsilon", "amsgrad": "adam.amsgrad"}),
    Entry("NovoGrad", {"learning_rate": 0.001, "beta_1": 0.9, "beta_2": 0.999,
                       "epsilon": 1e-7, "weight_decay": 0.0, "grad_averaging": False,
                       "amsgrad": False},
          [{"kind": "novograd", "beta_2": 0.999, "epsilon": 1e-7}],
          {"learning_rate": "novograd.learning_rate", "beta_1": "novograd.beta_1",
           "beta_2": "novograd.beta_2", "epsilon": "novograd.epsilon",
           "weight_decay": "novograd.weight_decay", "grad_averaging": NO, "amsgrad": NO}),
    Entry("ProximalAdagrad", {"learning_rate": 0.001, "initial_accumulator_value": 0.1,
                              "l1_regularization_strength": 0.0,
                              "l2_regularization_strength": 0.0},
          [rule("proximal_adagrad")],
          {k: f"proximal_adagrad.{k}" for k in (
              "learning_rate", "initial_accumulator_value", "l1_regularization_strength",
              "l2_regularization_strength")}),
    Entry("RectifiedAdam", {"learning_rate": 0.001, "beta_1": 0.9, "beta_2": 0.999,
                            "epsilon": 1e-7, "weight_decay": 0.0, "amsgrad": False,
                            "sma_threshold": 5.0, "total_steps": 0,
                            "warmup_proportion": 0.1, "min_lr": 0.0},
          [{"kind": "radam", "epsilon": 1e-7}],
          {"learning_rate": "radam.learning_rate", "beta_1": "radam.beta_1",
           "beta_2": "radam.beta_2", "epsilon": "radam.epsilon",
           "weight_decay": "weight_decay.weight_decay (a table after the rule)",
           "amsgrad": NO, "sma_threshold": "radam.threshold", "total_steps": WARMUP,
           "warmup_proportion": WARMUP, "min_lr": WARMUP}),
    Entry("SGDW", {"weight_decay": REQUIRED, "learning_rate": 0.001, "momentum": 0.0,
                   "nesterov": False, "exclude_from_weight_decay": None},
          [rule("sgd"), {"kind": "weight_decay", "weight_decay": 1e-4}],
          {"weight_decay": "weight_decay.weight_decay", "learning_rate": "sgd.learning_rate",
           "momentum": "sgd.momentum", "nesterov": "sgd.nesterov",
           "exclude_from_weight_decay": EXCLUDE}),
    Entry("AdamW", {"weight_decay": REQUIRED, "learning_rate": 0.001, "beta_1": 0.9,
                    "beta_2": 0.999, "epsilon": 1e-7, "amsgrad": False,
                    "exclude_from_weight_decay": None},
          [rule("adam"), {"kind": "weight_decay", "weight_decay": 1e-4}],
          {"weight_decay": "weight_decay.weight_decay", "learning_rate": "adam.learning_rate",
           "beta_1": "adam.beta_1", "beta_2": "adam.beta_2", "epsilon": "adam.epsilon",
           "amsgrad": "adam.amsgrad", "exclude_from_weight_decay": EXCLUDE}),
    Entry("Yogi", {"learning_rate": 0.01, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-3,
                   "l1_regularization_strength": 0.0, "l2_regularization_strength": 0.0,
                   "initial_accumulator_value": 1e-6, "activation": "sign"},
          [{"kind": "yogi", "learning_rate": 0.01, "epsilon": 1e-3,
            "initial_accumulator_value": 1e-6}],
          {"learning_rate": "yogi.learning_rate", "beta1": "yogi.beta_1",
           "beta2": "yogi.beta_2", "epsilon": "yogi.epsilon",
           "initial_accumulator_value": "yogi.initial_accumulator_value",
           "l1_regularization_strength": NO, "l2_regularization_strength": NO,
           "activation": "- `sign` only"}),
    Entry("Lookahead", {"optimizer": REQUIRED, "sync_period": 6, "slow_step_size": 0.5},
          [RULE, rule("lookahead")],
          {"optimizer": "the transforms before it", "sync_period": "lookahead.sync_period",
           "slow_step_size": "lookahead.slow_step_size"}),
    Entry("MovingAverage", {"optimizer": REQUIRED, "average_decay": 0.99,
                            "num_updates": None, "start_step": 0, "dynamic_decay": False},
          [RULE, rule("moving_average")],
          {"optimizer": "the transforms before it",
           **{k: f"moving_average.{k}" for k in ("average_decay", "num_updates", "start_step",
                                                 "dynamic_decay")}}),
    Entry("SWA", {"optimizer": REQUIRED, "start_averaging": 0, "average_period": 10},
          [RULE, rule("swa")],
          {"optimizer": "the transforms before it", "start_averaging": "swa.start_averaging",
           "average_period": "swa.average_period"}),
]
SCHEDULES = {  # TF Addons class: its __init__ arguments (scale_fn fixed by the class)
    "TriangularCyclicalLearningRate": ("initial_learning_rate", "maximal_learning_rate",
                                       "step_size", "scale_mode", "name"),
    "Triangular2CyclicalLearningRate": ("initial_learning_rate", "maximal_learning_rate",
                                        "step_size", "scale_mode", "name"),
    "ExponentialCyclicalLearningRate": ("initial_learning_rate", "maximal_learning_rate",
                                        "step_size", "scale_mode", "gamma", "name"),
}
WARMUP_TOML = (
    "`total_steps`, `warmup_proportion` and `min_lr` are a `learning_rate` schedule: with "
    "`W = total_steps * warmup_proportion` a whole number of at least 2, `learning_rate = "
    "{ kind = \"warmup\", warmup_steps = W - 1, init_value = lr / W, after = { kind = "
    "\"linear\", start = lr, end = min_lr, steps = total_steps - W } }` gives TF Addons' "
    "rates (tested with W = 10 and 20).")
SPARSE_HYBRID = (
    "On a sparse gradient TF Addons decays both moments on every row but moves only the "
    "touched rows; `lazy = true` is the nearest (a row touched again after 9 idle steps "
    "is 2.35e-4 off, 3.49e-3 without `lazy`).")
NOTES = {
    "AdaBelief": (
        "TF Addons adds its one `epsilon` both under and outside the root: set "
        "`epsilon` and `epsilon_root` to it, as above. TF Addons' default is "
        "`rectify=True`, RAdam's rectification, which gradpipe's `adabelief` (optax's) "
        "does not have: the table is `AdaBelief(rectify=False)`, which matches TF Addons' "
        "golden values within 7e-6 (dense, sparse, weight decay, warm-up, with "
        "`lookahead`); with rectification the two end 0.73 apart on TF Addons' sparse "
        "test. `amsgrad=True` moves TF Addons' golden values by 5e-3 to 4e-2. "
        + WARMUP_TOML + " " + SPARSE_HYBRID),
    "COCOB": "Tested with TF Addons' three dense samples (atol 2e-4) and its update "
             "rewritten in numpy (float16 to float64). TF Addons raises on a sparse "
             "gradient; gradpipe steps its rows, which equals the dense step.",
    "ConditionalGradient": "Tested with TF Addons' golden values in both norms, float16 "
                           "to float64, dense and sparse; departures are listed under "
                           "[Rules from TF Addons](transforms.md#rules-from-tf-addons).",
    "LAMB": (
        "Matches TF Addons' tests without weight decay within 1.7e-7 (float32). TF Addons "
        "adds `weight_decay * w` to the direction before the trust ratio; gradpipe's "
        "`lamb` is Keras's, without that term, and a `weight_decay` table after it "
        "decays outside the ratio (1e-4 off TF Addons' weight-decay test; 3.7e-5 "
        "without decay). A sparse gradient steps as its dense sum in both."),
    "LazyAdam": "The same maths: TF Addons' tests pass within 1.5e-7 (float32) and "
                "9.5e-4 (float16), dense and sparse; `lazy = true` must be written.",
    "NovoGrad": (
        "gradpipe's `novograd` is optax's, with optax's defaults (`beta_2 = 0.25`, "
        "`epsilon = 1e-6`): write TF Addons' as above. TF Addons' dense, weight-decay "
        "and sparse golden values then match within 1.1e-7. TF Addons folds the "
        "learning rate into the momentum, gradpipe scales the momentum by the current "
        "rate: the same for a constant rate, not for a schedule (0.31 apart after 5 "
        "steps of a halving rate). On a sparse gradient TF Addons decays only the "
        "touched rows; gradpipe makes the gradient dense."),
    "ProximalAdagrad": "Tested with TF Addons' six samples at its tolerance (rtol "
                       "1e-7), and against TensorFlow's `ApplyProximalAdagrad` kernels "
                       "themselves. `initial_accumulator_value` must be above 0.",
    "RectifiedAdam": (
        "TF Addons' golden values (dense, sparse, weight decay, warm-up, with "
        "`lookahead`) match within 1e-5. `sma_threshold` must be at least 4 (below, "
        "TF Addons' step can be NaN). TF Addons' `weight_decay` is decoupled and "
        "scaled by the rate: a `weight_decay` table after the rule, with `learning_rate` "
        "the rule's; on a sparse gradient it decays every row where TF Addons decays "
        "the touched ones (`lazy = true` on both tables decays only those). "
        + WARMUP_TOML + " " + SPARSE_HYBRID),
    "SGDW": "TF Addons' SGDW test passes (dense and sparse, float16 to float64). On a "
            "sparse gradient gradpipe decays every row, as for a dense one; TF Addons "
            "decays only the touched rows (and, without momentum, none). `sgd` without "
            "momentum and `weight_decay` with `lazy = true` decay only the touched rows.",
    "AdamW": "TF Addons' AdamW test passes (dense and sparse, float16 to float64), "
             "within 1.7e-7 in float32. Keras's `AdamW` and gradpipe's `adamw` scale the "
             "decay by the learning rate; TF Addons' does not, which `adam` + "
             "`weight_decay` (its `learning_rate` 1.0) keeps. On a sparse gradient "
             "gradpipe decays every row; TF Addons only the touched ones. With "
             "`lazy = true` in both tables (TF Addons' `LazyAdam` extended with the "
             "decay) only the touched rows decay and move, as TF Addons does "
             "(tested against its numpy reference, rtol 1e-6).",
    "Yogi": (
        "Approximate only. gradpipe's `yogi` is optax's: its first moment starts at "
        "`initial_accumulator_value` (TF Addons': at 0), and its `epsilon` is added "
        "after the bias correction (TF Addons': before). Only `beta1 = 0` with "
        "`initial_accumulator_value = 1.0` reproduces TF Addons' tests (1.2e-7); at "
        "TF Addons' defaults gradpipe's first step is 1.3 to 1.9 times TF Addons'. "
        "TF Addons' proximal `l1`/`l2` and `activation=\"tanh\"` have no key."),
    "Lookahead": "TF Addons' exact-ratio tests (k = 5, 10, 100, dense and sparse) pass "
                 "within 1e-6; a checkpoint mid-period resumes bit for bit.",
    "MovingAverage": "TF Addons' `test_run`, `test_start_step`, `test_dynamic_decay` and "
                     "its swap under `MirroredStrategy` pass. `num_updates` is a fixed "
                     "integer (TF Addons also takes a variable).",
    "SWA": "TF Addons' `test_averaging` passes; swapping in before the first member is "
           "an error.",
}


def _config(kind: str, name: str) -> Any:
    return get_registry().get(kind, name).config_cls


def _default(kind: str, name: str, key: str) -> Any:
    fields = {f.name: f for f in attrs.fields(_config(kind, name))}
    if key not in fields:
        raise SystemExit(f"{kind} {name!r} has no key {key!r}: update docs/gen_tfa_page.py")
    default = fields[key].default
    return REQUIRED if default is attrs.NOTHING else default


def _text(value: Any) -> str:
    if value is REQUIRED:
        return "required"
    if value is None:
        return "`None`"
    return f"`{value!r}`" if not isinstance(value, bool) else f"`{str(value).lower()}`"


def _same(ours: Any, theirs: Any) -> bool:
    """Equal defaults: 100 and 100.0 are, False and 0 are not."""
    return ours == theirs and isinstance(ours, bool) == isinstance(theirs, bool)


def _key_text(target: str, tfa_default: Any) -> str:
    """``kind.key [(remark)]`` as "`kind`: `key` (its default)", marked where it
    differs from TF Addons' default."""
    name, _, remark = target.partition(" ")
    kind, key = name.split(".")
    default = _default("transform", kind, key)
    same = "" if _same(default, tfa_default) else " **differs**"
    return f"`{kind}`: `{key}` ({_text(default)}){same}" + (f" {remark}" if remark else "")


def _argument_rows(entry: Entry) -> list[str]:
    rows = ["| TF Addons argument (default) | gradpipe key (default) |", "|---|---|"]
    for argument, tfa_default in entry.arguments.items():
        target = entry.keys.get(argument, "- ")
        if target.startswith("-"):
            ours = "not expressible" + (f": {target[2:]}" if target[2:] else "")
        elif not re.match(r"\w+\.\w+", target):
            ours = target
        else:
            ours = ", ".join(_key_text(one.strip(), tfa_default)
                             for one in target.split(","))
        rows.append(f"| `{argument}` ({_text(tfa_default)}) | {ours} |")
    return rows


def optimizer_section(entry: Entry) -> list[str]:
    gradpipe.parse({"transforms": entry.transforms})  # a valid table, or the script fails
    toml = "\n\n".join("[[transforms]]\n" + tomli_w.dumps(t).strip()
                         for t in entry.transforms)
    return [f"### `{entry.tfa}`", "", "```toml", toml, "```", "",
            *_argument_rows(entry), "", *([NOTES[entry.tfa], ""] if entry.tfa in NOTES
                                           else [])]


def schedule_rows() -> list[str]:
    rows = ["| TF Addons | `kind` | keys |", "|---|---|---|"]
    for cls, arguments in SCHEDULES.items():
        for key in arguments:
            _default("schedule", cls, key)
        rows.append(f"| `{cls}` | `{cls}` | {', '.join(f'`{k}`' for k in arguments)} |")
    return rows


def summary_rows() -> list[str]:
    rows = ["| TF Addons | gradpipe |", "|---|---|"]
    for entry in OPTIMIZERS:
        kinds = " + ".join(f"`{t['kind']}`" if t is not RULE else "any rule"
                           for t in entry.transforms)
        rows.append(f"| [`{entry.tfa}`](#{entry.tfa.lower()}) | {kinds} |")
    return [*rows,
            "| [`extend_with_decoupled_weight_decay`](#wrappers) | any rule + `weight_decay` |",
            "| [`MultiOptimizer`](#wrappers) | rules with `variables = [...]` |",
            *(f"| [`{cls}`](#schedules) | schedule `{cls}` |" for cls in SCHEDULES),
            "| [`CyclicalLearningRate`](#schedules) | its three subclasses |"]


def page() -> str:
    return "\n".join([
        "# Coming from TF Addons",
        "",
        "<!-- generated by docs/gen_tfa_page.py from the registry; the docs tests "
        "check it -->",
        "",
        "TF Addons reached its end of life without a Keras 3 release. Each of its",
        "optimizers and learning-rate schedules is a gradpipe component or chain:",
        "this page gives, for each class, the TOML, each argument's gradpipe key with",
        "both defaults (**differs** where they are not the same), and what gradpipe",
        "cannot express. Where a table reproduces TF Addons' numbers, TF Addons' own",
        "tests, ported, say so (`tests/test_tfa_*.py`; TF Addons does not import on",
        "TensorFlow 2.21).",
        "",
        *summary_rows(),
        "",
        "## Wrappers",
        "",
        "`Lookahead(opt)`, `MovingAverage(opt)` and `SWA(opt)` wrap an optimizer;",
        "here they wrap the transforms before them in the chain, whatever those are",
        "(any rule, a third-party transform, clipping, weight decay). TF Addons'",
        "`swap_weights()` (twice) is `with averaged_weights(pipe): ...`, and",
        "`assign_average_vars(var_list)` is `assign_averaged_weights(pipe)`, both",
        "from `gradpipe.plugins.weight_averaging` (see",
        "[Transforms](transforms.md#wrapping-a-chain-lookahead-moving_average-swa)).",
        "",
        "`extend_with_decoupled_weight_decay(AnyOptimizer)` is any rule followed by",
        "`weight_decay`, whose `learning_rate` (default 1.0) multiplies the decay:",
        "the extension's decay (`AdamW`, `SGDW`) is `weight_decay * w`, not scaled by",
        "the rate, which the default keeps (`RectifiedAdam`'s own `weight_decay` is",
        "scaled: see its section). `MultiOptimizer([(opt, layers), ...])` and discriminative",
        "layer training are several rules in one chain, each with `variables = [...]`",
        "(see [Transforms](transforms.md#different-rules-per-variable-group-tf-addons-"
        "multioptimizer)).",
        "",
        "## Optimizers",
        "",
        *[line for entry in OPTIMIZERS for line in optimizer_section(entry)],
        "## Schedules",
        "",
        *schedule_rows(),
        "",
        "Each takes TF Addons' arguments under the same names, with its defaults",
        "(see [Schedules](schedules.md#cyclical-schedules-tf-addons)). The generic",
        "`CyclicalLearningRate(scale_fn=...)` takes a Python function, which a file",
        "cannot hold: its three subclasses above are the scale functions TF Addons",
        "ships; another one is a schedule plugin (see the",
        "[plugin-author guide](plugin-guide.md)).",
    ]).rstrip() + "\n"


def main() -> int:
    return write_or_check({PAGE: page()}, "gen_tfa_page.py")


if __name__ == "__main__":
    sys.exit(main())
