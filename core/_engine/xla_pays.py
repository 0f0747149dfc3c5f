"""When ``jit_compile = "auto"`` compiles: where XLA's fusion pays for its compile.

Measured on 2 cores; each run is in ``benchmarks/HISTORY.md``.
"""

from __future__ import annotations

from typing import Any

from ..transform import accelerator_visible

# XLA fuses the chain's element-wise passes, so clipping + Adam's functional update over
# 64 variables of 1-10k floats is 0.82x the plain step's time. A rule with an in-place
# kernel (sgd, adam) makes fewer passes on the plain path already: there XLA pays only
# on larger variables (sgd compiled 1.04x at 1-10k floats, and sgd alone, one op a
# variable, never: xla_trial.one_kernel_alone; adam's six fused kernels, in model.fit
# against Keras: compiled 1.02x and in place 0.95x to 1.00x at a mean of 12.8k elements,
# compiled 0.82x to 0.84x and in place 0.91x at 44.9k; 0.71x of the in-place step's time
# compiled at 400k).
# Compiling takes about 0.15 s per variable of a distinct shape.
# On a CPU that compile is paid before the first step, and pays back only where
# each compiled function updates many elements: the 784-256-256-10 MLP (5 shapes,
# 54k elements each) with Adam and a global clip, 2 cores: 1.54 s to its first
# step compiled against 0.53 uncompiled (Keras: 0.23), for 0.18 ms less per step,
# 5,600 steps to break even; a 5,000 x 32 embedding classifier's first epoch 3.9 s
# against 2.7 (Keras: 2.3). 50 variables of 400k floats in one shape: 1.4 s
# compiled against Keras's 1.5, and each step 0.51x Keras's.
AUTO_JIT_MIN_ELEMENTS_PER_SHAPE_CPU = 1 << 18
AUTO_JIT_MAX_VARIABLES = 128
AUTO_JIT_MIN_MEAN_SIZE = 4_096
AUTO_JIT_MIN_MEAN_SIZE_IN_PLACE = 16_384


def xla_pays(sizes: list[int | None], in_place: bool, shapes: int, hint: bool = False
             ) -> tuple[bool, str]:
    """Few variables, not small, and on a CPU many elements per distinct shape (one
    compile each): "auto" compiles them (one XLA loop per array). ``hint``: a reason
    against names the option that compiles them anyway."""
    min_mean = AUTO_JIT_MIN_MEAN_SIZE_IN_PLACE if in_place else AUTO_JIT_MIN_MEAN_SIZE
    if None in sizes:
        return False, "a variable has an unknown shape"
    known = [s for s in sizes if s is not None]
    mean = sum(known) / max(len(known), 1)
    per_shape = sum(known) / max(shapes, 1)
    if len(known) > AUTO_JIT_MAX_VARIABLES:
        return False, (f"{len(known)} variables, more than the {AUTO_JIT_MAX_VARIABLES} "
                       "XLA compiles one by one")
    if mean < min_mean:
        return False, (f"{mean:,.0f} elements per variable on average, fewer than the "
                       f"{min_mean:,} where XLA pays{' over an in-place kernel' * in_place}")
    on_cpu = not accelerator_visible()
    if on_cpu and per_shape < AUTO_JIT_MIN_ELEMENTS_PER_SHAPE_CPU:
        return False, (f"{shapes} distinct shape{'s' * (shapes > 1)} of {per_shape:,.0f} "
                       f"elements on average, fewer than the "
                       f"{AUTO_JIT_MIN_ELEMENTS_PER_SHAPE_CPU:,} where compiling each on a "
                       "CPU, before the first step, pays for itself"
                       + "; jit_compile = true compiles them" * hint)
    beside = " where XLA pays over an in-place kernel" * in_place
    per_cpu = (f", {per_shape:,.0f} per distinct shape (at least "
               f"{AUTO_JIT_MIN_ELEMENTS_PER_SHAPE_CPU:,} on a CPU)") if on_cpu else ""
    return True, (f"{len(known)} variables of {mean:,.0f} elements on average (at least "
                  f"{min_mean:,}{beside}){per_cpu}")


def distinct_shapes(variables: list[Any]) -> int:
    """How many XLA functions a step compiled variable by variable would compile."""
    return len({(tuple(v.shape), v.dtype) for v in variables})
