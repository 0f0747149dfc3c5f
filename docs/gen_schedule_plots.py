"""Draw one plot per built-in schedule for docs/schedules.md.

    python docs/gen_schedule_plots.py [OUT_DIR]     # default: docs/img

The examples below are the ones the schedules page shows; a test checks that
every built-in schedule has one and that the page embeds its image.
"""

from __future__ import annotations

import sys
from pathlib import Path

import gradpipe
from gradpipe.schedule_eval import evaluate, plot

STEPS = 1000
EXAMPLES: dict[str, dict] = {
    "fixed_lr": {"kind": "fixed_lr", "learning_rate": 0.1},
    "constant": {"kind": "constant", "value": 0.1},
    "piecewise_constant": {"kind": "piecewise_constant", "learning_rate": 0.1,
                           "boundaries": [300, 700], "decay_rates": [0.1, 0.01]},
    "exp_decay": {"kind": "exp_decay", "learning_rate": 0.1, "decay_steps": 200,
                  "decay_rate": 0.5, "use_staircase_decay": True, "begin_decay_at": 100,
                  "min_lr": 0.005},
    "poly_decay": {"kind": "poly_decay", "learning_rate": 0.1, "decay_steps": 800,
                   "power": 2.0, "warmup_steps": 100, "min_lr": 0.001},
    "cosine_decay": {"kind": "cosine_decay", "learning_rate": 0.1, "decay_steps": 800,
                     "warmup_steps": 100, "min_lr": 0.1},
    "transformer_policy": {"kind": "transformer_policy", "learning_rate": 2.0,
                           "d_model": 512, "warmup_steps": 200},
    "inv_poly_decay": {"kind": "inv_poly_decay", "learning_rate": 0.1, "decay_steps": 500,
                       "min_lr": 0.01},
    "linear": {"kind": "linear", "start": 0.1, "end": 0.01, "steps": 600, "begin": 200},
    "cosine": {"kind": "cosine", "learning_rate": 0.1, "warmup_steps": 100,
               "decay_steps": 800, "min_lr": 0.01},
    "warmup": {"kind": "warmup", "warmup_steps": 100,
               "after": {"kind": "exp_decay", "learning_rate": 0.1, "decay_steps": 300,
                         "decay_rate": 0.5}},
    "sequence": {"kind": "sequence", "boundaries": [300],
                 "schedules": [{"kind": "constant", "value": 0.1},
                               {"kind": "cosine", "learning_rate": 0.1, "decay_steps": 700}]},
    # Keras's schedules, under their class names
    "ExponentialDecay": {"kind": "ExponentialDecay", "initial_learning_rate": 0.1,
                         "decay_steps": 200, "decay_rate": 0.5, "staircase": True},
    "PiecewiseConstantDecay": {"kind": "PiecewiseConstantDecay", "boundaries": [300, 700],
                               "values": [0.1, 0.01, 0.001]},
    "PolynomialDecay": {"kind": "PolynomialDecay", "initial_learning_rate": 0.1,
                        "decay_steps": 300, "end_learning_rate": 0.001, "power": 2.0,
                        "cycle": True},
    "InverseTimeDecay": {"kind": "InverseTimeDecay", "initial_learning_rate": 0.1,
                         "decay_steps": 100, "decay_rate": 0.5},
    "CosineDecay": {"kind": "CosineDecay", "initial_learning_rate": 0.0, "decay_steps": 800,
                    "alpha": 0.1, "warmup_target": 0.1, "warmup_steps": 200},
    "CosineDecayRestarts": {"kind": "CosineDecayRestarts", "initial_learning_rate": 0.1,
                            "first_decay_steps": 150, "t_mul": 2.0, "m_mul": 0.8,
                            "alpha": 0.05},
    # TF Addons' cyclical learning rates, under their class names
    "TriangularCyclicalLearningRate": {"kind": "TriangularCyclicalLearningRate",
                                       "initial_learning_rate": 0.01,
                                       "maximal_learning_rate": 0.1, "step_size": 125},
    "Triangular2CyclicalLearningRate": {"kind": "Triangular2CyclicalLearningRate",
                                        "initial_learning_rate": 0.01,
                                        "maximal_learning_rate": 0.1, "step_size": 125},
    "ExponentialCyclicalLearningRate": {"kind": "ExponentialCyclicalLearningRate",
                                        "initial_learning_rate": 0.01,
                                        "maximal_learning_rate": 0.1, "step_size": 125,
                                        "gamma": 0.998},
}


def main(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, table in EXAMPLES.items():
        spec = gradpipe.parse({"schedules": {name: table}, "transforms": [{"kind": "sgd"}]})
        plot(evaluate(spec, STEPS), str(out_dir / f"schedule_{name}.png"), title=name)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "img")
