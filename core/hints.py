"""Did-you-mean hints for a name gradpipe does not know.

A near miss gets the closest known name (``adma``: ``adam``). A name that
another library uses gets what gradpipe calls it, or why it is not one key:
Keras's and optax's argument names, optax's schedules and transformations,
TF Addons' and TF1's classes, OpenSeq2Seq's keys and ``optimize_loss``
arguments, and options that are a transform of their own here.
"""

from __future__ import annotations

from collections.abc import Iterable

# Keys as optax (and PyTorch) name them, where gradpipe keeps Keras's names
_OTHER_NAMES = {"b1": "beta_1", "b2": "beta_2", "b3": "beta_3", "eps": "epsilon",
                "eps_root": "epsilon_root", "lr": "learning_rate", "key": "seed"}
# optax's schedule and clipping arguments: the first of gradpipe's keys the table has
_OPTAX_NAMES = {"peak_value": ("learning_rate",),
                "init_value": ("warmup_init", "start", "init_value", "learning_rate",
                               "initial_learning_rate"),
                "end_value": ("min_lr", "end"), "transition_steps": ("decay_steps", "steps"),
                "transition_begin": ("begin_decay_at", "begin"), "max_norm": ("clip_norm",),
                "max_delta": ("clip_value_max",)}
# optax's schedules whose gradpipe kind is another name: the kind, and what differs
_OPTAX_SCHEDULES = {
    "warmup_cosine_decay_schedule": ("cosine", "whose decay_steps excludes the warm-up"),
    "cosine_decay_schedule": ("CosineDecay", ""),
    "linear_schedule": ("linear", ""),
    "polynomial_schedule": ("poly_decay", ""),
    "exponential_decay": ("exp_decay", ""),
    "piecewise_constant_schedule": ("PiecewiseConstantDecay",
                                    "whose boundaries are one step earlier"),
    "join_schedules": ("sequence", ""),
    "warmup_exponential_decay_schedule": ("warmup", "with an ExponentialDecay after it"),
}

_PER_GROUP = "one update rule per variable group, each with variables = [\"regex\", ...]"
_MOMENTUM = "'sgd' with momentum (Keras's momentum: see docs/transforms.md)"

# keys of optax, OpenSeq2Seq, TF1 and Keras that gradpipe's table (one holding the first
# name) names otherwise, or lacks
_OTHER_KEYS = {
    "max_grad_norm": (("clip_norm", "did you mean 'clip_norm'? OpenSeq2Seq's max_grad_norm"),),
    "scale": (("l2", "did you mean 'l2'? tf.contrib's l2_regularizer(scale)"),),
    "dynamic_growth_steps": (("increment_period", "did you mean 'increment_period'? Keras's "
                                                  "LossScaleOptimizer dynamic_growth_steps"),),
    "decay": (("rho", "did you mean 'rho'? optax's decay"),
              ("average_decay", "did you mean 'average_decay'? optax's ema decay")),
    "decay_rate": (("beta_2_decay", "optax's decay_rate is beta_2_decay = -decay_rate here, "
                                    "Keras's sign"),),
    "initial_scale": (("rho", "optax's initial_scale: not expressible, the average starts at "
                              "0, as Keras's does"),),
    "debias": (("average_decay", "optax's ema debiases; moving_average does not, as TF "
                                 "Addons' MovingAverage"),),
    "reset_state": (("sync_period", "optax's reset_state: not expressible, the rule's state "
                                    "carries over each sync, as in TF Addons' Lookahead"),),
    "nesterov": (("amsgrad", "optax's adam(nesterov=True) is kind = \"nadamw\" here, at "
                             "weight_decay = 0 for adam; 'nadam' is Keras's Nadam, another "
                             "rule"),),
    "eps_root": (("epsilon", "optax's eps_root: this rule has none, it adds epsilon as "
                             "Keras's does"),),
    "mu_dtype": (("learning_rate", "optax's mu_dtype: not expressible, the state takes each "
                                   "variable's dtype (float32 for float16 and bfloat16)"),),
    "every_k_schedule": (("accumulation_steps", "did you mean 'accumulation_steps'? optax's "
                                                "MultiSteps every_k_schedule, a number here"),),
    "apply_if_finite": (("check_updates", "did you mean 'check_updates'? true by default: "
                                          "a non-finite step changes nothing"),),
    "max_consecutive_errors": (("check_updates", "optax's apply_if_finite limit: "
                                                 "check_updates skips every non-finite step, "
                                                 "with no limit"),),
}
# optax's transformations that are no kind here: what does their work (in a list of kinds)
_OPTAX_KINDS = {
    "chain": "the [[transforms]] tables, in order, are the chain",
    "MultiSteps": "[pipeline] accumulation_steps = k",
    "apply_if_finite": "[pipeline] check_updates = true, the default: a non-finite step "
                       "changes nothing",
    "multi_transform": _PER_GROUP,
    "partition": _PER_GROUP,
    "masked": "a table's variables or exclude = [\"regex\", ...]",
    "inject_hyperparams": "every float key takes a schedule (\"@name\"), and "
                          "pipe.learning_rate = x sets the rate while training",
    "ema": "kind = \"moving_average\" averages the weights; an average of the updates has "
           "no transform",
    "clip": "kind = \"clip_by_value\", with clip_value_min and clip_value_max",
    "add_decayed_weights": "kind = \"weight_decay\" after the rule, or \"l2\" before it",
}
# optax's scale_by_X whose rule here is not named X
_SCALE_BY = {"belief": "adabelief", "rss": "adagrad", "rms": "rmsprop", "stddev": "rmsprop",
             "trust_ratio": "lamb"}

# what a component's key hint adds for that component
_OF_A_KIND = {("weight_decay", "lamb"): "Keras's Lamb decays so; optax's and TF Addons' LAMB "
                                         "decay inside the trust ratio, which is not "
                                         "expressible"}

# OpenSeq2Seq's summaries with no scalar here (in a list of summaries)
_OPENSEQ2SEQ_SUMMARIES = ("gradients", "gradient_norm", "variables", "variable_norm",
                          "larc_summaries")

# OpenSeq2Seq's keys that gradpipe names otherwise (and larc_params' larc_ prefix)
_OPENSEQ2SEQ_NAMES = {"iter_size": "accumulation_steps"}
# TF Addons' RectifiedAdam's warm-up and decay arguments: a learning_rate schedule here
_TFA_SCHEDULE = ("total_steps", "warmup_proportion", "min_lr")
# How other libraries choose a rule's variables (TF Addons' MultiOptimizer takes layers)
_SELECTING = ("variable", "var_list", "layers", "layer", "decay_var_list")
# Options of other libraries' optimizers that are a transform of their own here
_OWN_TRANSFORM = {"weight_decay": ("weight_decay", "after"),
                  "clipnorm": ("clip_by_norm", "before"),
                  "global_clipnorm": ("clip_by_global_norm", "before"),
                  "clipvalue": ("clip_by_value", "before")}
# Optimizer classes of TF Addons and Keras whose gradpipe chain is not their name
_OTHER_CLASSES = {
    "RectifiedAdam": ("radam", "'radam'"),
    "LazyAdam": ("adam", "'adam' with lazy = true"),
    "SGDW": ("sgd", "'sgd', then a 'weight_decay' transform"),
    "MultiOptimizer": ("adam", _PER_GROUP),
    "extend_with_decoupled_weight_decay": ("weight_decay",
                                           "any rule, then a 'weight_decay' transform"),
    # TF1's optimizers, and OpenSeq2Seq's names for them
    "Momentum": ("sgd", _MOMENTUM),
    "momentum": ("sgd", _MOMENTUM),
    "MomentumOptimizer": ("sgd", _MOMENTUM),
    "GradientDescentOptimizer": ("sgd", "'sgd'"),
    "AdamOptimizer": ("adam", "'adam' (Keras's epsilon, 1e-7; TF1's was 1e-8)"),
    "RMSPropOptimizer": ("rmsprop", "'rmsprop' (TF1's decay is rho)"),
    "AdagradOptimizer": ("adagrad", "'adagrad'"),
    "l2_regularizer": ("l2", "'l2', a transform before the update rule"),
    # automatic loss scaling, of a [loss_scale] table
    "automatic": ("backoff", "'backoff' (OpenSeq2Seq's Backoff), 'logmax' or 'dynamic' "
                             "(Keras's)"),
}
# OpenSeq2Seq's optimize_loss arguments, written as sections: where each goes here
_OPENSEQ2SEQ_ARGUMENTS = {
    "optimizer": "an update rule, a [[transforms]] table such as kind = \"sgd\"",
    "optimizer_params": "the keys of the update rule's [[transforms]] table",
    "lr_policy": "a [schedules.NAME] table (kind = \"poly_decay\", ...), then "
                 "learning_rate = \"@NAME\" on the rule",
    "lr_policy_params": "the keys of a [schedules.NAME] table",
    "larc_params": "a [[transforms]] table with kind = \"larc\" before the rule",
    "max_grad_norm": "a [[transforms]] table with kind = \"clip_by_global_norm\" and "
                     "clip_norm",
    "regularizer": "a [[transforms]] table with kind = \"l2\" before the rule",
    "regularizer_params": "the l2 key of an l2 [[transforms]] table",
    "loss_scaling": "a [loss_scale] table with kind = \"backoff\", \"logmax\" or "
                    "\"fixed\"",
    "dtype": "Keras's mixed_float16 policy in your code, and a [loss_scale] table",
    "iter_size": "accumulation_steps in [pipeline]",
    "summaries": "summaries in [pipeline]",
}


def did_you_mean(word: str, choices: Iterable[str], kind: str = "") -> str:
    """A ``" (did you mean 'x'?)"`` suffix, or ``""`` when nothing is close; ``kind``:
    the component whose keys ``choices`` are, where it has a hint of its own."""
    import difflib

    names = sorted(set(choices))
    elsewhere = _named_elsewhere(word, names)
    if elsewhere and (word, kind) in _OF_A_KIND:
        elsewhere = f"{elsewhere[:-1]}; {_OF_A_KIND[word, kind]})"
    if elsewhere is not None:
        return elsewhere
    # 'cosinedecay': 'CosineDecay'; 'ProximalAdagrad': 'proximal_adagrad'
    same = [c for c in names if c.lower().replace("_", "") == word.lower().replace("_", "")]
    if same:
        return f" (did you mean {same[0]!r}?)"
    close = difflib.get_close_matches(word, names, n=5, cutoff=0.6)
    # Of the similar names, the fewest edits (a swap of two letters is one): 'adma'
    # is 'adam', though 'adamax' shares more letters with it.
    best = min(close, key=lambda c: _edits(word, c), default=None)
    return f" (did you mean {best!r}?)" if best else ""


def _named_elsewhere(word: str, names: list[str]) -> str | None:
    """The hint for a name another library uses (Keras, optax, TF Addons,
    OpenSeq2Seq), where difflib would find nothing or the wrong thing."""
    if _OTHER_NAMES.get(word) in names:  # 'b1' is nothing like 'beta_1' to difflib
        why = "optax's key" if word == "key" else "gradpipe keeps Keras's names"
        return f" (did you mean {_OTHER_NAMES[word]!r}? {why})"
    found = next((hint for key, hint in _OTHER_KEYS.get(word, ()) if key in names), None)
    if found:
        return f" ({found})"
    if "adam" in names:  # a kind of transform
        if word in _OPTAX_KINDS:
            return f" (optax's {word}: {_OPTAX_KINDS[word]}; see docs/coming-from-optax.md)"
        rule = word.removeprefix("scale_by_")
        rule = _SCALE_BY.get(rule, rule)
        if word.startswith("scale_by_") and rule in names:
            return (f" (did you mean {rule!r}? a rule here scales by its own learning_rate: "
                    f"optax's {word}, then scale_by_learning_rate)")
    if word in _OPTAX_NAMES:
        ours = next((n for n in _OPTAX_NAMES[word] if n in names), None)
        if ours:
            return f" (did you mean {ours!r}? optax's {word})"
    if word in ("mask", "weight_decay_mask"):
        return _optax_mask(names) or None
    if word in _OPTAX_SCHEDULES and _OPTAX_SCHEDULES[word][0] in names:
        kind, differs = _OPTAX_SCHEDULES[word]
        return (f" (optax's {word} is kind = \"{kind}\"{', ' + differs if differs else ''}:"
                " see docs/coming-from-optax.md)")
    if word in _OPENSEQ2SEQ_SUMMARIES and "update_ratios" in names:
        return (" (OpenSeq2Seq's, per variable: no scalar here; global_gradient_norm is "
                "all gradients together, update_ratios each variable's step over its "
                "weights)")
    if word in _OPENSEQ2SEQ_ARGUMENTS and "pipeline" in names:  # the file's sections
        return f" (OpenSeq2Seq's {word} is {_OPENSEQ2SEQ_ARGUMENTS[word]} here)"
    if _OPENSEQ2SEQ_NAMES.get(word) in names:
        return f" (did you mean {_OPENSEQ2SEQ_NAMES[word]!r}? OpenSeq2Seq's {word})"
    if word.startswith("larc_") and word[5:] in names:  # OpenSeq2Seq's larc_eta: eta
        return f" (did you mean {word[5:]!r}?)"
    if word == "exclude_from_weight_decay" and "exclude" in names:
        return (" (did you mean 'exclude'? it leaves variables out of this whole table: to "
                "leave them out of the decay alone, decay in a 'weight_decay' table after the "
                "rule, with that exclude)")
    if word in _TFA_SCHEDULE and "learning_rate" in names:
        return (f" (TF Addons' {word} is part of a learning_rate schedule here: see "
                "docs/coming-from-tf-addons.md)")
    if word in _SELECTING and "variables" in names:
        return (" (did you mean 'variables'? regular expressions matched against variable "
                "paths, such as [\"dense_1/\"])")
    if word in _OWN_TRANSFORM and "variables" in names:  # a transform's table
        kind, where = _OWN_TRANSFORM[word]
        scaled = ("; its learning_rate scales the decay: this rule's (\"@lr\" for a "
                  "schedule) decays by learning_rate * weight_decay * w, as optax, Keras and "
                  "TF Addons' RectifiedAdam do; its default 1.0 by weight_decay * w, as TF "
                  "Addons' AdamW and SGDW do" if kind == "weight_decay" else "")
        return (f" ({word} is a transform of its own here: a [[transforms]] table with "
                f"kind = \"{kind}\" {where} this one{scaled})")
    if word in _OTHER_CLASSES and _OTHER_CLASSES[word][0] in names:
        return f" ({word} is {_OTHER_CLASSES[word][1]} here)"
    return None


def _edits(a: str, b: str) -> int:
    """Insertions, deletions, substitutions and swaps of neighbours from ``a`` to ``b``."""
    rows = [list(range(len(b) + 1))]
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            row[j] = min(rows[-1][j] + 1, row[j - 1] + 1,
                         rows[-1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], rows[-2][j - 2] + 1)
        rows.append(row)
    return rows[-1][-1]


def _optax_mask(names: list[str]) -> str:
    """optax's ``mask`` marks the parameters a decay applies to."""
    if "exclude_from_weight_decay" in names:
        return (" (optax's mask lists the parameters to decay; exclude_from_weight_decay "
                "lists, as regular expressions, those NOT to decay: the opposite)")
    if "weight_decay" in names and "variables" in names:
        return (" (optax's mask is variables = [\"regex\", ...] here: the variables this "
                "table decays)")
    if "variables" in names:
        return (" (optax's mask belongs on the weight_decay table after the rule, as its "
                "variables = [\"regex\", ...])")
    return ""
