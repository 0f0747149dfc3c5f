"""Plugin discovery through real entry points of throwaway distributions."""

from __future__ import annotations

import json

import pytest

GOOD = """
    import attrs
    import gradpipe

    @attrs.frozen(kw_only=True)
    class Config:
        factor: float = gradpipe.hyperparameter(default=2.0)

    def scale(cfg):
        factor = gradpipe.hyper(cfg.factor)
        def update(grads, state, variables):
            f = factor()
            return gradpipe.map_grads(lambda g: g * f, grads), state
        return gradpipe.Transform(gradpipe.no_state, update)

    @gradpipe.hookimpl
    def gradpipe_register_transforms(register):
        register("{name}", scale, Config)
"""


def by_entry_point(data: dict) -> dict[str, dict]:
    return {p["entry_point"]: p for p in data["plugins"]}


class TestLoading:
    def test_third_party_plugin_is_found(self, fake_dists):
        """A distribution with a gradpipe entry point contributes its components."""
        fake_dists.add("gradpipe-scale", "1.2", {"scale": "gp_scale"},
                       {"gp_scale": GOOD.format(name="scale")})
        data = fake_dists.registry_json()
        assert "scale" in data["transforms"]
        record = by_entry_point(data)["scale"]
        assert record["status"] == "loaded"
        assert record["distribution"] == "gradpipe-scale"
        assert record["version"] == "1.2"
        assert record["hooks"] == ["gradpipe_register_transforms"]
        assert record["components"] == {"transform": ["scale"]}

    def test_failing_import_is_isolated(self, fake_dists):
        """A plugin that raises at import is recorded; the others still load."""
        fake_dists.add("gradpipe-broken", "0.1", {"broken": "gp_broken"},
                       {"gp_broken": "raise RuntimeError('boom at import')"})
        fake_dists.add("gradpipe-scale", "1.2", {"scale": "gp_scale"},
                       {"gp_scale": GOOD.format(name="scale")})
        data = fake_dists.registry_json()
        broken = by_entry_point(data)["broken"]
        assert broken["status"] == "failed"
        assert "RuntimeError: boom at import" in broken["error"]
        assert "scale" in data["transforms"] and "adam" in data["transforms"]

    def test_failed_plugin_named_in_pipeline_error(self, fake_dists):
        """A pipeline naming a component of a failed plugin is told so."""
        fake_dists.add("gradpipe-broken", "0.1", {"broken": "gp_broken"},
                       {"gp_broken": "raise ImportError('needs libfoo')"})
        result = fake_dists.run("""
            import gradpipe
            try:
                gradpipe.parse({"transforms": [{"kind": "brokenclip"}]})
            except gradpipe.ConfigError as e:
                print(e)
        """)
        assert "gradpipe-broken 0.1 (entry point 'broken')" in result.stdout
        assert "needs libfoo" in result.stdout

    def test_strict_mode_raises(self, fake_dists):
        fake_dists.add("gradpipe-broken", "0.1", {"broken": "gp_broken"},
                       {"gp_broken": "raise RuntimeError('boom')"})
        result = fake_dists.run(
            "from gradpipe.registry import get_registry; get_registry()",
            env={"GRADPIPE_STRICT_PLUGINS": "1"})
        assert result.returncode != 0
        assert "PluginError" in result.stderr and "boom" in result.stderr

    def test_conflict_names_both_providers(self, fake_dists):
        """Two plugins registering one name: a PluginError naming both."""
        fake_dists.add("gradpipe-one", "1.0", {"one": "gp_one"},
                       {"gp_one": GOOD.format(name="scale")})
        fake_dists.add("gradpipe-two", "2.0", {"two": "gp_two"},
                       {"gp_two": GOOD.format(name="scale")})
        data = fake_dists.registry_json()
        two = by_entry_point(data)["two"]
        assert two["status"] == "conflict"
        assert "gradpipe-one 1.0 (entry point 'one')" in two["error"]
        assert "gradpipe-two 2.0 (entry point 'two')" in two["error"]
        result = fake_dists.run("""
            from gradpipe.registry import get_registry
            from gradpipe import PluginError
            try:
                get_registry().get("transform", "scale")
            except PluginError as e:
                print("PluginError:", e)
        """)
        assert "PluginError: transform 'scale' is provided by several plugins" in result.stdout
        assert "'gradpipe-one>scale' or 'gradpipe-two>scale'" in result.stdout

    def test_qualified_name_picks_a_provider(self, fake_dists):
        """`dist>name` selects one of two clashing plugins and survives to_toml()."""
        fake_dists.add("gradpipe-one", "1.0", {"one": "gp_one"},
                       {"gp_one": GOOD.format(name="scale")})
        fake_dists.add("gradpipe-two", "2.0", {"two": "gp_two"},
                       {"gp_two": GOOD.format(name="scale")})
        result = fake_dists.run("""
            import gradpipe
            spec = gradpipe.parse({"transforms": [{"kind": "gradpipe-two>scale"},
                                                  {"kind": "sgd"}]})
            print(spec.transforms[0].dist, spec.transforms[0].version)
            print(spec.to_toml())
        """)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("gradpipe-two 2.0")
        assert 'kind = "gradpipe-two>scale"' in result.stdout

    @pytest.mark.parametrize("name", ["adam", "sgd"])
    def test_clash_with_a_builtin_is_shown_on_the_newcomer(self, fake_dists, name):
        """A third party registering a built-in's name is flagged on its own line, in
        the default listing and in the JSON, whichever loads first (built-ins load on
        demand), and the fix renames or blocks it, never the built-in."""
        fake_dists.add("gradpipe-evil", "1.0", {"evil": "gp_evil"},
                       {"gp_evil": GOOD.format(name=name)})
        data = fake_dists.registry_json()
        flagged = [p for p in data["plugins"] if p["status"] == "conflict"]
        assert [p["entry_point"] for p in flagged] == ["evil"]
        assert not any(p["builtin"] and p["status"] != "loaded" for p in data["plugins"])
        error = flagged[0]["error"]
        assert f"transform {name!r} is a built-in; gradpipe-evil 1.0 (entry point 'evil') " \
            "registers it again" in error
        assert "rename it in gradpipe-evil" in error
        assert "GRADPIPE_DISABLED_PLUGINS=evil" in error
        assert f"'gradpipe>{name}' or 'gradpipe-evil>{name}'" in error
        listing = fake_dists.run("from gradpipe.cli import main; main(['plugins'])")
        line = next(x for x in listing.stdout.splitlines() if x.startswith("gradpipe-evil"))
        assert "[CONFLICT: " in line and "GRADPIPE_DISABLED_PLUGINS=evil" in line
        listed = fake_dists.run("from gradpipe.cli import main; main(['plugins', '--json'])")
        statuses = {p["entry_point"]: p["status"] for p in json.loads(listed.stdout)}
        assert statuses["evil"] == "conflict"

    def test_misspelt_hook_fails_loudly(self, fake_dists):
        """check_pending: an unknown hook name fails the plugin with a suggestion."""
        code = GOOD.format(name="scale").replace(
            "def gradpipe_register_transforms", "def gradpipe_register_transfroms")
        fake_dists.add("gradpipe-typo", "0.1", {"typo": "gp_typo"}, {"gp_typo": code})
        record = by_entry_point(fake_dists.registry_json())["typo"]
        assert record["status"] == "failed"
        assert "did you mean 'gradpipe_register_transforms'" in record["error"]

    @pytest.mark.parametrize("capabilities, expected", [
        ("gradpipe.plugin.Capabilities(update_rul=True)",
         "unknown capability 'update_rul' (did you mean 'update_rule'?)"),
        ("{'update_rul': True}", "unknown capability 'update_rul' (did you mean"),
        ("gradpipe.plugin.Capabilities(update_rule=1)",
         "capability update_rule must be True or False, got 1"),
    ])
    def test_a_misspelt_or_mistyped_capability_fails_the_plugin(self, fake_dists,
                                                                capabilities, expected):
        code = GOOD.format(name="scale").replace(
            "import gradpipe\n", "import gradpipe\n    import gradpipe.plugin\n").replace(
            "register(\"scale\", scale, Config)",
            f"register(\"scale\", scale, Config, capabilities={capabilities})")
        fake_dists.add("gradpipe-caps", "0.1", {"caps": "gp_caps"}, {"gp_caps": code})
        record = by_entry_point(fake_dists.registry_json())["caps"]
        assert record["status"] == "failed"
        assert expected in record["error"]
        assert record["location"].endswith("gp_caps.py:19")  # the register(...) line

    @pytest.mark.slow
    def test_import_failure_names_the_plugins_own_line(self, fake_dists):
        """A plugin failing at import: its own file and line (not importlib's), and the
        full traceback on request (--traceback or GRADPIPE_PLUGIN_TRACEBACKS=1)."""
        fake_dists.add("gradpipe-deep", "0.1", {"deep": "gp_deep"}, {
            "gp_deep": "import gp_helper\n\nVALUE = gp_helper.broken()\n",
            "gp_helper": "def broken():\n    return {}['missing']\n"})
        record = by_entry_point(fake_dists.registry_json())["deep"]
        assert record["status"] == "failed" and "KeyError" in record["error"]
        assert record["location"].endswith("gp_deep.py:3")
        assert "gp_helper.py" in record["traceback"]
        short = fake_dists.run("from gradpipe.cli import main; main(['plugins'])").stdout
        assert "gp_deep.py:3" in short and "Traceback" not in short
        assert "--traceback shows the full traceback" in short
        for argv, env in ((["plugins", "--traceback"], None),
                          (["plugins"], {"GRADPIPE_PLUGIN_TRACEBACKS": "1"})):
            full = fake_dists.run(f"from gradpipe.cli import main; main({argv!r})", env).stdout
            assert "Traceback (most recent call last)" in full
            assert "gp_helper.py\", line 2, in broken" in full

    @pytest.mark.parametrize("config, expected", [
        ("k: int = 0.5", "the default of 'k' must be an integer, got a float 0.5"),
        ("k: float = gradpipe.hyperparameter(default=-1.0, validator=positive())",
         "the default of 'k' must be > 0, got -1.0"),
        ("example: ClassVar[dict] = {'k': 'x'}\n        k: float = 1.0",
         "example['k'] must be a number, got a string"),
        ("example: ClassVar[dict] = {'kk': 1.0}\n        k: float = 1.0",
         "example sets 'kk', which is not a key (did you mean 'k'?)"),
        ("k: float", "required 'k' but no example value"),
    ])
    def test_config_defaults_and_example_are_checked_at_registration(self, fake_dists,
                                                                     config, expected):
        """A plugin's own mistake fails the plugin, named, when it registers: never later,
        blamed on the user's file."""
        code = GOOD.format(name="typed").replace(
            "factor: float = gradpipe.hyperparameter(default=2.0)",
            f"factor: float = gradpipe.hyperparameter(default=2.0)\n        {config}").replace(
            "import attrs", "import attrs\n    from typing import ClassVar\n"
            "    from gradpipe.plugin import positive")
        fake_dists.add("gradpipe-typed", "0.1", {"typed": "gp_typed"}, {"gp_typed": code})
        record = by_entry_point(fake_dists.registry_json())["typed"]
        assert record["status"] == "failed"
        assert "config class Config of transform 'typed'" in record["error"]
        assert expected in record["error"]
        result = fake_dists.run("""
            import gradpipe
            try:
                gradpipe.parse({"transforms": [{"kind": "typed"}, {"kind": "sgd"}]})
            except gradpipe.ConfigError as e:
                print(e)
        """)
        assert "comes from plugin gradpipe-typed 0.1 (entry point 'typed'), which failed" \
            in result.stdout

    def test_registration_error_rolls_back(self, fake_dists):
        """A plugin whose hook raises after registering one name is rolled back."""
        code = GOOD.format(name="scale") + """
    @gradpipe.hookimpl
    def gradpipe_register_schedules(register):
        raise ValueError("bad schedule")
"""
        fake_dists.add("gradpipe-half", "0.1", {"half": "gp_half"}, {"gp_half": code})
        data = fake_dists.registry_json()
        assert by_entry_point(data)["half"]["status"] == "failed"
        assert "scale" not in data["transforms"]


class TestSwitches:
    @pytest.fixture
    def two_plugins(self, fake_dists):
        fake_dists.add("gradpipe-one", "1.0", {"one": "gp_one"},
                       {"gp_one": GOOD.format(name="scale_one")})
        fake_dists.add("gradpipe-two", "1.0", {"two": "gp_two"},
                       {"gp_two": GOOD.format(name="scale_two")})
        return fake_dists

    @pytest.mark.parametrize("value", ["two", "gradpipe-two"])
    def test_block_list_by_entry_point_or_dist(self, two_plugins, value):
        data = two_plugins.registry_json({"GRADPIPE_DISABLED_PLUGINS": value})
        assert "scale_one" in data["transforms"]
        assert "scale_two" not in data["transforms"]
        assert by_entry_point(data)["two"]["status"] == "blocked"

    def test_allow_list(self, two_plugins):
        data = two_plugins.registry_json({"GRADPIPE_PLUGINS": "gradpipe-one"})
        assert "scale_one" in data["transforms"] and "scale_two" not in data["transforms"]
        assert "adam" in data["transforms"]  # built-ins always load

    def test_disable_autoload_keeps_builtins(self, two_plugins):
        data = two_plugins.registry_json({"GRADPIPE_DISABLE_PLUGIN_AUTOLOAD": "1"})
        assert "adam" in data["transforms"]
        assert not {"scale_one", "scale_two"} & set(data["transforms"])


def test_wrong_plugin_api_version_is_refused(fake_dists):
    code = "\n    GRADPIPE_PLUGIN_API = 3" + GOOD.format(name="future")
    fake_dists.add("gradpipe-future", "3.0", {"future": "gp_future"}, {"gp_future": code})
    data = fake_dists.registry_json()
    record = by_entry_point(data)["future"]
    assert record["status"] == "failed" and "future" not in data["transforms"]
    assert "built for gradpipe plugin API 3, but this gradpipe provides API 2" in \
        record["error"]


class TestLazyLoading:
    def test_a_pipeline_imports_only_the_plugins_it_names(self):
        """parse() of an sgd pipeline imports neither other built-ins nor contrib plugins."""
        import subprocess
        import sys

        code = ("import sys, gradpipe; gradpipe.parse({'transforms': [{'kind': 'sgd'}]}); "
                "print(sorted(m for m in sys.modules if 'gradpipe' in m))")
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        modules = result.stdout
        assert "gradpipe.plugins.sgd" in modules
        for absent in ("gradpipe.plugins.adam", "gradpipe.plugins.clippy_adagrad",
                       "gradpipe.plugins.convergence",
                       "gradpipe_agc", "gradpipe_ema", "tensorflow"):
            assert absent not in modules, absent

    def test_index_matches_what_the_modules_register(self):
        """The gradpipe.components index can never drift from the real registrations."""
        from gradpipe.entry_points import component_index
        from gradpipe.registry import Registry

        index = {key: dist for key, (dist, _) in component_index(
            "gradpipe.components").items()}
        eager = Registry()
        eager.load_entry_points(lazy=False)
        registered = {key: comp.provider.dist for key, comp in eager.components.items()
                      if comp.provider.dist in set(index.values())}
        assert index == registered

    def test_names_of_unimported_plugins_are_known(self):
        from gradpipe.registry import Registry

        lazy = Registry()
        lazy.load_entry_points()
        assert "clippy_adagrad" in lazy.names("transform")
        assert ("transform", "clippy_adagrad") not in lazy.components
        assert lazy.get("transform", "clippy_adagrad").name == "clippy_adagrad"
