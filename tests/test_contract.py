"""Every built-in component passes the public contract suite (gradpipe.testing)."""

from __future__ import annotations

import pytest

from gradpipe.testing import check_component, contract_cases


@pytest.mark.parametrize("kind, name", contract_cases(dist="gradpipe"))
def test_builtin_contract(kind, name):
    check_component(kind, name)


def _register(name, update, apply=None, init=None, **declarations):
    """Register an in-process test plugin whose transform uses ``update`` (and ``apply``),
    its config class carrying ``declarations`` (``preserves_finite=True``...)."""
    import attrs

    import gradpipe
    from gradpipe.registry import Provider, get_registry

    Config = attrs.frozen(kw_only=True)(type("Config", (), dict(declarations)))

    def factory(cfg):
        return gradpipe.Transform(init or gradpipe.no_state, update, apply)

    class Plugin:
        @gradpipe.hookimpl
        def gradpipe_register_transforms(self, register):
            register(name, factory, Config)

    registry = get_registry()
    if ("transform", name) not in registry.components:
        registry.register_plugin(Plugin(), Provider(dist="gradpipe-test-broken", version="0",
                                                    entry_point=name))


def test_suite_catches_a_changed_gradient_structure():
    from gradpipe.testing import ContractError

    _register("drops_one", lambda grads, state, variables: (list(grads)[:-1], state))
    with pytest.raises(ContractError, match="must return one update per variable"):
        check_component("transform", "drops_one")


def test_suite_catches_numpy_inside_the_step():
    from gradpipe.testing import ContractError

    def update(grads, state, variables):
        scale = float(grads[0].numpy().max())  # host sync: breaks under tf.function
        return [None if g is None else g * scale for g in grads], state

    _register("calls_numpy", update)
    with pytest.raises(ContractError, match=r"(?s)failed inside tf.function.*no \.numpy\(\)"):
        check_component("transform", "calls_numpy")


def test_suite_catches_a_false_preserves_finite_declaration():
    from gradpipe.testing import ContractError

    def update(grads, state, variables):  # 1/g overflows for tiny finite gradients
        return [None if g is None else 1.0 / (g * 1e-30) for g in grads], state

    _register("claims_finite", update, preserves_finite=True)
    with pytest.raises(ContractError, match="declares preserves_finite"):
        check_component("transform", "claims_finite")


def test_suite_catches_an_apply_that_differs_from_update():
    from gradpipe.testing import ContractError

    def update(grads, state, variables):
        return [None if g is None else g * 0.1 for g in grads], state

    def apply(grads, slots, variables):
        return [v.assign_sub(g * 0.2) for g, v in zip(grads, variables) if g is not None]

    _register("sloppy_apply", update, apply, update_rule=True, preserves_finite=True)
    with pytest.raises(ContractError, match=r"apply\(\) and update\(\) disagree"):
        check_component("transform", "sloppy_apply")


def test_suite_catches_a_predicated_transform_that_ignores_skipped_steps():
    from gradpipe.testing import ContractError

    def update(grads, state, variables):  # a counter that should stay put on skips
        return [None if g is None else g * 0.1 for g in grads], state + 1

    _register("forgets_skips", update, init=lambda variables: 0.0, update_rule=True,
              xla_compatible=True, predicated=True, preserves_finite=True)
    with pytest.raises(ContractError, match="select_applied"):
        check_component("transform", "forgets_skips")
