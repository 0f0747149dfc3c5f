"""Every built-in component passes the public contract suite (gradpipe.testing)."""

from __future__ import annotations

import pytest

from gradpipe.testing import check_component, contract_cases


@pytest.mark.parametrize("kind, name", contract_cases(dist="gradpipe"))
def test_builtin_contract(kind, name):
    check_component(kind, name)


def _register(name, update):
    """Register an in-process test plugin whose transform uses ``update``."""
    import attrs

    import gradpipe
    from gradpipe.registry import Provider, get_registry

    @attrs.frozen(kw_only=True)
    class Config:
        pass

    def factory(cfg):
        return gradpipe.Transform(gradpipe.no_state, update)

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
