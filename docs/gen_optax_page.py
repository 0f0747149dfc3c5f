"""Generate docs/coming-from-optax.md: ``python docs/gen_optax_page.py [--check]``.

optax's defaults come from ``tests/references/optax_golden.json`` (recorded by optax) or, for
rules that do not follow optax, from its ``optax/_src/alias.py`` signatures, written below. Every
table is parsed, every key named must exist and gradpipe's defaults are read from the registry.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path
from typing import Any, NamedTuple

import attrs
import tomli_w
from _generated import write_or_check

import gradpipe
from gradpipe.registry import get_registry
from gradpipe.toml_source import toml_value

PAGE = Path(__file__).parent / "coming-from-optax.md"
GOLDEN = json.loads((Path(__file__).parents[1] / "tests/references/optax_golden.json").read_text())
REQUIRED = object()
KEYS = {"b1": "beta_1", "b2": "beta_2", "b3": "beta_3", "eps": "epsilon",
        "eps_root": "epsilon_root", "mask": "exclude_from_weight_decay", "key": "seed"}
NO = "- no such option"
DTYPE = "- state in the variable's dtype (float32 for float16 and bfloat16)"
MASK = "=() (regexes of the variables *not* to decay; optax's mask marks those to decay)"
ADAM = "b1=0.9 b2=0.999 eps=1e-8 eps_root=0.0 mu_dtype=None"
NOTES = """
[adabelief] optax after 0.2.8 adds `weight_decay` (default `None`) and `weight_decay_mask`:
`weight_decay` and `exclude_from_weight_decay` here (`lr * (step + weight_decay * w)`, tested).
[adadelta] Keras's `Adadelta`, optax's formula; optax's `None` rate drops the sign flip too. optax's
decay joins the gradient: `l2`.
[adafactor] Approximate: gradpipe's is Keras's. Both factor the second moment, clip its RMS and
scale by the variable's RMS, but optax factors only variables whose two largest axes reach
`min_dim_size_to_factor`, and its `None` rate is 1 where gradpipe's is `min(lr, 1/sqrt(t))`.
[adagrad] Keras's `Adagrad`.
[adam] Keras's `Adam`: its `epsilon` is added before the bias correction (optax's `eps * sqrt(1 -
b2^t)`), which tells only where a gradient is near `epsilon`. optax's AMSGrad: `amsgrad`.
[adamax] optax's `adamaxw` is its `adamax` and the decay, so `adamax` is `adamaxw` at `weight_decay
= 0`. (gradpipe's `adamax` is Keras's.)
[adamw] Keras's `AdamW`: optax's decay, `lr * weight_decay * w`, and `adam`'s `epsilon`. An
element that starts at its minimum has only the decay's gradient (2e-5 at `weight_decay = 1e-4`),
near `epsilon`, where its two places tell: 2.2e-3 apart after 12 steps. optax's `adamw` exactly is
`nadamw` with `nesterov = false`.
[lamb] Keras's `Lamb`. optax decays inside the trust ratio, a `weight_decay` table after `lamb`
outside it (0.71 apart at decay 0.1).
[lars] optax's composition.
[lion] gradpipe's `lion` is Keras's, without decay; optax's decays by default, `-lr * (sign(...) +
weight_decay * w)`: `lion`, then `weight_decay` with `learning_rate` the rule's (`"@lr"` for a
schedule). At `weight_decay`'s default `learning_rate = 1.0` the decay is `1/lr` times optax's
(0.21 apart at rate 0.1). `lion` alone is `optax.lion(weight_decay=0)`.
[nadam] optax's `nadam` is `adam(nesterov=True)`, its `nadamw` `adamw(nesterov=True)`: so `nadam` is
`nadamw` at `weight_decay = 0`. gradpipe's `nadam` is
Keras's, another rule (Dozat's momentum schedule; 0.35 apart).
[noisy_sgd] TensorFlow's noise, keyed by `seed` and the step (not JAX's); its variance is tested.
[optimistic_adam_v2] optax's chain: Adam's Nesterov direction, the optimistic step, the rate (the
second rule takes the first one's step as its gradient). Deprecated `optimistic_adam(learning_rate,
optimism)`: `alpha = learning_rate`, `beta = optimism` (`None`: the rate), `learning_rate = 1.0`.
[rmsprop] Keras's `RMSprop`, whose momentum, like optax's, sums steps already scaled by the rate.
[rprop] optax 0.2.8 returns the previous step's update (its first step is 0; its pull request
1725); gradpipe steps with this step's sign (tested in closed form). `learning_rate` is the first
step size.
[sgd] Keras's `SGD`. A scheduled rate parts them: optax's momentum sums raw gradients, scaled by
this step's rate.
[yogi] `initial_accumulator_value` (1e-6) is that of optax's `scale_by_yogi`.
"""


class Entry(NamedTuple):
    optax: str  # the alias: optax.<optax>
    arguments: dict[str, Any]  # its arguments and defaults (REQUIRED: none)
    transforms: list[dict[str, Any]]  # the gradpipe chain
    keys: dict[str, str]  # argument -> "kind.key[=optax's, as gradpipe's] [remark]", "- why", text
    note: str  # under the table


def values(spec: str) -> dict[str, Any]:
    """``"name=literal name ..."``; a name alone is a required argument."""
    return {k: ast.literal_eval(v) if eq else REQUIRED
            for k, eq, v in (p.partition("=") for p in spec.split())}


def tables(spec: str) -> list[dict[str, Any]]:
    """``"kind key=literal ... + kind ..."``: a chain of tables."""
    return [{"kind": t.split()[0], **values(t.partition(" ")[2])} for t in spec.split(" + ")]


def entries(block: str) -> list[str]:
    """The entries of a text block: an indented line continues the one above."""
    return [" ".join(e.split()) for e in re.split(r"\n(?! )", block.strip())]


NOTE = dict(re.findall(r"\[(\w+)\] (.*)", re.sub(r" (?=\[\w+\] )", "\n",
                                                  " ".join(NOTES.split()))))


def _calls(alias: str, cases: list[dict[str, Any]]) -> str:
    return " and ".join("`{}({})`".format(alias, ", ".join(f"{k}={v!r}" for k, v in c.items()))
                        for c in cases)


def _written(chain: list[dict[str, Any]], shown: list[dict[str, Any]]) -> str:
    """"as above", or the tested chain where its kinds are not the table's."""
    if [t["kind"] for t in chain] == [t["kind"] for t in shown]:
        return "as above"
    return "as " + " + ".join(f"`{toml_value(t)}`" for t in chain)


def entry(alias: str, arguments: str, chain: str, keys: dict[str, str] | None = None) -> Entry:
    """Each argument is the first table's key of its (Keras's) name unless ``keys`` says; for
    a rule that follows optax (``chain`` is the alias), optax's recorded defaults come first."""
    golden = chain == alias and alias in GOLDEN["defaults"]
    cases = [c["kwargs"] for c in GOLDEN["cases"].values() if golden and c["alias"] == alias]
    tested = cases and (f"Twelve steps of {_calls(alias, cases)} match optax's own within rtol "
                        f"{'1e-5' if alias == 'fromage' else '2e-6'}.")
    transforms = tables(chain)
    mapped = [c for c in GOLDEN["mapped"].values() if c["alias"] == alias]
    if mapped:
        tested = " ".join(f"Twelve steps of {_calls(alias, [c['kwargs']])} written "
                          f"{_written(c['transforms'], transforms)} match optax's own within "
                          f"rtol {c['tolerance'][0]:g}, atol {c['tolerance'][1]:g}."
                          for c in mapped)
    args = {"learning_rate": REQUIRED, **(GOLDEN["defaults"][alias] if golden else {}),
            **values(arguments)}
    auto = {a: DTYPE if a.endswith("_dtype") else f"{transforms[0]['kind']}.{KEYS.get(a, a)}"
            + (MASK if a == "mask" else "") for a in args}
    return Entry(alias, args, transforms, auto | (keys or {}),
                 " ".join(filter(None, (tested, NOTE.get(alias)))))


OPTIMIZERS = sorted([
    *(entry(a, "", a) for a in ("adabelief", "fromage", "novograd", "optimistic_gradient_descent",
                                "radam", "rprop", "sign_sgd", "sm3", "yogi")),
    *(entry(a, extra, a) for a, extra in (("adamaxw", "mask=None"), ("adan", "mask=None"), (
        "amsgrad", "mu_dtype=None"), ("signum", "accumulator_dtype=None"))),
    entry("nadamw", "mask=None mu_dtype=None", "nadamw"),
    entry("noisy_sgd", "key=None", "noisy_sgd", {"key": "noisy_sgd.seed=0 (optax's `None`: 0)"}),
    entry("adadelta", "learning_rate=None rho=0.9 eps=1e-6 weight_decay=0.0 weight_decay_mask=None",
          "adadelta rho=0.9 epsilon=1e-6", {"weight_decay": "l2.l2 (a table before the rule)",
                                            "weight_decay_mask": "`exclude` on that `l2` table"}),
    entry("adafactor", "learning_rate=None min_dim_size_to_factor=128 decay_rate=0.8 "
          "decay_offset=0 multiply_by_parameter_scale=True clipping_threshold=1.0 momentum=None "
          "dtype_momentum='jnp.float32' weight_decay_rate=None eps=1e-30 factored=True "
          "weight_decay_mask=None", "adafactor", {
              "learning_rate": "adafactor.learning_rate (the step takes `min(it, 1/sqrt(t))`)",
              "min_dim_size_to_factor": "- every variable of rank 2 or more is factored, over "
              "its last two axes", "decay_rate": "adafactor.beta_2_decay=-0.8 (`-decay_rate`)",
              "decay_offset": NO, "multiply_by_parameter_scale": "adafactor.epsilon_2=0.001 "
              "(always on; the floor of the scale, optax's fixed 1e-3)", "momentum": NO,
              "clipping_threshold": "adafactor.clip_threshold", "eps": "adafactor.epsilon_1",
              "dtype_momentum": "- with `momentum` only", "factored": "- always factored",
              "weight_decay_rate": "weight_decay.weight_decay (a table after the rule)",
              "weight_decay_mask": "`exclude` on that table"}),
    entry("adagrad", "initial_accumulator_value=0.1 eps=1e-7", "adagrad"),
    entry("adam", ADAM + " nesterov=False", "adam epsilon=1e-8", {"nesterov": "- see `nadam`",
                                                                  "eps_root": NO}),
    entry("adamax", "b1=0.9 b2=0.999 eps=1e-8", "adamaxw weight_decay=0.0"),
    entry("adamw", ADAM + " weight_decay=1e-4 mask=None nesterov=False", "adamw epsilon=1e-8 "
          "weight_decay=1e-4", {"eps_root": NO, "nesterov": "`nadamw`'s `nesterov` (`false`: "
                                "optax's `adamw` exactly)"}),
    entry("lamb", "b1=0.9 b2=0.999 eps=1e-6 eps_root=0.0 weight_decay=0.0 mask=None",
          "lamb epsilon=1e-6", {"eps_root": NO, "mask": "- with `weight_decay` only",
                                "weight_decay": "- decay inside the trust ratio (below)"}),
    entry("lars", "weight_decay=0.0 weight_decay_mask=True trust_coefficient=0.001 eps=0.0 "
          "trust_ratio_mask=True momentum=0.9 nesterov=False", "lars", {
              "weight_decay_mask": "a second `lars` table with `weight_decay = 0` for the others "
              "(`variables` on it, `exclude` on the first)", "trust_ratio_mask": NO}),
    entry("lion", "b1=0.9 b2=0.99 mu_dtype=None weight_decay=1e-3 mask=None",
          "lion learning_rate=1e-3 + weight_decay weight_decay=1e-3 learning_rate=1e-3", {
              "learning_rate": "lion.learning_rate, weight_decay.learning_rate (the same rate)",
              "weight_decay": "weight_decay.weight_decay", "mask": "`exclude` on that table"}),
    entry("nadam", ADAM + " nesterov=True", "nadamw weight_decay=0.0", {"nesterov": "always"}),
    entry("optimistic_adam_v2", "alpha=1.0 beta=1.0 " + ADAM + " nesterov=True",
          "nadamw learning_rate=1.0 weight_decay=0.0 + optimistic_gradient_descent", {"nesterov":
              "always"} | {k: f"optimistic_gradient_descent.{k}" for k in ("learning_rate",
                                                                             "alpha", "beta")}),
    entry("rmsprop", "decay=0.9 eps=1e-8 initial_scale=0.0 eps_in_sqrt=True centered=False "
          "momentum=None nesterov=False bias_correction=False", "rmsprop epsilon=1e-8", {
              "decay": "rmsprop.rho", "initial_scale": "- the average starts at 0",
              "eps_in_sqrt": "- always inside the root", "momentum": "rmsprop.momentum=0.0",
              "nesterov": NO, "bias_correction": NO}),
    entry("sgd", "momentum=None nesterov=False accumulator_dtype=None", "sgd",
          {"momentum": "sgd.momentum=0.0"}),
])
MISSING = """
[lbfgs] no gradpipe rule: its line search evaluates the loss at trial points; nearest: none
[polyak_sgd] no gradpipe rule: its step size needs the loss value (`f(x) - f_min`); nearest: `sgd`
[optimistic_adam] `nadamw` + `optimistic_gradient_descent`, as for
  [`optimistic_adam_v2`](#optimistic_adam_v2) (optax deprecates it)
"""
TRANSFORMS = """
clip_by_global_norm(max_norm) | clip_by_global_norm clip_norm=1.0 | a table before the rule
clip(max_delta) | clip_by_value clip_value_min=-0.5 clip_value_max=0.5 | for `max_delta = 0.5`
chain(add_decayed_weights(wd), scale_by_...) | l2 l2=1e-4 | before the rule, into the gradient
chain(scale_by_..., add_decayed_weights(wd), scale_by_learning_rate(lr)) | weight_decay
  weight_decay=1e-4 learning_rate=1e-3 | after the rule, `learning_rate` the rule's
masked(inner, mask) | weight_decay weight_decay=1e-4 exclude=['bias'] | `variables` or `exclude`:
  regular expressions over variable paths, so a mask by shape (`p.ndim > 1`) names the layers'
  `kernel`s instead
partition(...), multi_transform(...) | adam variables=['head/'] | a rule for each group, with its
  `variables`; `[pipeline] freeze = [regex, ...]` for a group optax sets to zero
MultiSteps(opt, every_k_schedule=4) | [pipeline] accumulation_steps=4 | the mean of the 4
  gradients (optax's `use_grad_mean=True`); a number, not a schedule
apply_if_finite(opt, max_consecutive_errors) | [pipeline] check_updates=True | the default; a step
  with non-finite gradients (or, by this, updates) changes nothing, with no limit on how many
lookahead(opt, sync_period, slow_step_size) | lookahead sync_period=6 slow_step_size=0.5 | after
  the rule (TF Addons'; not run against optax): the model holds `params.fast`; no `reset_state`
ema(decay) on the parameters | moving_average average_decay=0.999 | after the rule: an average of
  the weights, started from them, not debiased; `ema` in a chain (of updates) has no transform
scale_by_schedule(fn), inject_hyperparams(...) | - | every float key takes a schedule (below);
  while training, `pipe.learning_rate = x` sets the rate of a pipeline whose rules share one
  ([Setting the learning rate](user-guide.md#setting-the-learning-rate)); no other key is set
  while training
contrib.schedule_free_adamw(learning_rate, warmup_steps, b1, ...) | schedule_free_adamw
  learning_rate=0.0025 | Keras 3's `ScheduleFreeAdamW` (not run against optax); `with
  averaged_weights(pipe):` evaluates at the averaged point, as optax's
  `schedule_free_eval_params` (see [Update rules](transforms.md))
"""
def _text(value: Any) -> str:
    return "required" if value is REQUIRED else (
        f"`{str(value).lower() if isinstance(value, bool) else value}`")


def _key_text(target: str, theirs: Any) -> str:
    """``kind.key[=value] [remark]`` as "`kind`: `key` (its default)", marked where it
    differs from optax's default (or from ``value``, optax's in gradpipe's terms)."""
    name, _, remark = target.partition(" ")
    kind, key, value = re.fullmatch(r"(\w+)\.(\w+)(?:=(.+))?", name).groups()
    fields = {f.name: f.default for f in attrs.fields(get_registry().get("transform", kind)
                                                      .config_cls)}
    if key not in fields:
        raise SystemExit(f"{kind} has no key {key!r}: update docs/gen_optax_page.py")
    ours = REQUIRED if fields[key] is attrs.NOTHING else fields[key]
    theirs = ast.literal_eval(value) if value else theirs
    same = REQUIRED in (ours, theirs) or (
        ours == theirs and isinstance(ours, bool) == isinstance(theirs, bool))
    return f"`{kind}`: `{key}` ({_text(ours)})" + ("" if same else " **differs**") + (
        f" {remark}" if remark else "")


def _toml(transforms: list[dict[str, Any]]) -> str:
    gradpipe.parse({"transforms": transforms})  # a valid table, or the script fails
    return "\n\n".join("[[transforms]]\n" + tomli_w.dumps(t).strip() for t in transforms)


def optimizer_section(entry: Entry) -> list[str]:
    rows = [f"### `{entry.optax}`", "", "```toml", _toml(entry.transforms), "```", "",
            "| optax argument (default) | gradpipe key (default) |", "|---|---|"]
    for argument, default in entry.arguments.items():
        ours = entry.keys[argument]
        if re.match(r"\w+\.\w+", ours):
            ours = ", ".join(_key_text(t, default) for t in re.split(r", (?=\w+\.\w)", ours))
        rows.append(f"| `{argument}` ({_text(default)}) | "
                    + re.sub(r"^- ", "not expressible: ", ours) + " |")
    return [*rows, "", *([entry.note, ""] if entry.note else [])]


def schedule_rows() -> list[str]:
    """optax's schedules as recorded with their gradpipe tables (each tested)."""
    rows = ["| optax | `learning_rate =` |", "|---|---|"]
    for call, recorded in GOLDEN["schedules"].items():
        gradpipe.parse({"transforms": [{"kind": "sgd", "learning_rate": recorded["table"]}]})
        rows.append(f"| `{call}` | `{toml_value(recorded['table'])}` |")
    return rows


def mapping_rows(block: str) -> list[str]:
    """``optax | spec | text`` rows; a spec is a table, ``-``, or ``[pipeline] key=literal``."""
    rows = ["| optax | gradpipe |", "|---|---|"]
    for call, spec, *text in (line.split(" | ") for line in entries(block)):
        if spec.startswith("[pipeline]"):
            [(key, value)] = values(spec.partition(" ")[2]).items()
            gradpipe.parse({"pipeline": {key: value}, "transforms": [{"kind": "sgd"}]})
            spec = f"[pipeline] {key} = {toml_value(value)}"
        elif spec != "-":
            [table] = tables(spec)
            after = get_registry().get("transform", table["kind"]).capabilities.after_update_rule
            _toml([{"kind": "sgd"}, table] if after else [table, {"kind": "sgd"}])
            spec = toml_value(table)
        rows.append(f"| `{call}` | {': '.join(([f'`{spec}`'] if spec != '-' else []) + text)} |")
    return rows


TEMPLATE = """\
# Coming from optax

<!-- generated by docs/gen_optax_page.py from the registry; the docs tests check it -->

For each optimizer of optax's alias module (optax {version}) this page gives the gradpipe TOML,
each argument with its optax default and the gradpipe key with gradpipe's (**differs** where they
are not the same), and what gradpipe cannot express. optax has no default learning rate (*required*
below): write yours. Keys use Keras's names for optax's `b1`, `b2`, `b3`, `eps`, `eps_root`
(`beta_1`, `beta_2`, `beta_3`, `epsilon`, `epsilon_root`); optax's name is an error that names
gradpipe's. optax's `None` for a momentum is gradpipe's 0.

The {rules} rules that follow optax ([Rules from optax](transforms.md#rules-from-optax)) have the
defaults optax recorded in `tests/references/optax_golden.json`; `tests/test_optax_rules.py` checks
those defaults, runs optax's optimisation test (`alias_test.py`) for each, and compares their steps
with optax's where a note says so. Other aliases map to Keras's rules or to chains; where a note
gives a tolerance, the same test runs the table against the steps optax {version} recorded (on the
optimisation test's parabola and a quadratic, float32).

{summary}

## Chains and transforms

`optax.chain(a, b, ...)` is a `[[transforms]]` table for each, in the same order: optax negates the
step in `scale_by_learning_rate` and adds it, gradpipe's rate is a key of the rule and the engine
subtracts the chain's output. So `optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(...))` is
a `clip_by_global_norm` table, then an `adamw` table.

{transforms}

## Schedules

Any float key takes a schedule table (`learning_rate = {{ kind = ... }}`), or `"@name"` of a
`[schedules.name]` table (see [Schedules](schedules.md)). Like optax's `count`, the step starts at 0
and counts applied updates. Each example gives the value optax {version} recorded at every step
from 0 to 119, within 3e-6 relative (tested). `warmup_cosine_decay_schedule`'s `decay_steps`
counts the warm-up, `cosine`'s does not, and its `exponent` has no key (1 only);
`piecewise_constant_schedule` scales from each boundary on, `PiecewiseConstantDecay` from the step
after: its boundaries are one less.

{schedules}

## Optimizers

{optimizers}
"""


def page() -> str:
    rows = {e.optax: f"| [`{e.optax}`](#{e.optax}) | "
            + " + ".join(f"`{t['kind']}`" for t in e.transforms) + " |" for e in OPTIMIZERS}
    rows |= {a: f"| `{a}` | {text} |" for a, text in (
        re.fullmatch(r"\[(\w+)\] (.*)", line).groups() for line in entries(MISSING))}
    return TEMPLATE.format(
        version=GOLDEN["optax"], rules=len(GOLDEN["defaults"]),
        summary="\n".join(["| optax | gradpipe |", "|---|---|", *(rows[a] for a in sorted(rows))]),
        transforms="\n".join(mapping_rows(TRANSFORMS)),
        schedules="\n".join(schedule_rows()),
        optimizers="\n".join(line for e in OPTIMIZERS for line in optimizer_section(e)),
    ).rstrip() + "\n"


def main() -> int:
    return write_or_check({PAGE: page()}, "gen_optax_page.py")


if __name__ == "__main__":
    sys.exit(main())
