"""`gradpipe new-plugin`: the generated package installs and passes its own tests."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _install_and_test(tmp_path, *args: str) -> tuple[str, str]:
    """Generate a plugin, pip-install it into a folder of its own and run its own
    tests against it: ``(gradpipe plugins --json, pytest's output)``."""
    import os

    made = subprocess.run([sys.executable, "-m", "gradpipe.cli", "new-plugin", *args,
                           "--directory", str(tmp_path)], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    (root,) = tmp_path.glob("gradpipe-*")
    target = tmp_path / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                              "--no-build-isolation", "--target", str(target), str(root)],
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stdout + install.stderr
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(target), os.environ.get("PYTHONPATH")])), "PATH": "/usr/bin:/bin"}
    listed = subprocess.run([sys.executable, "-m", "gradpipe.cli", "plugins", "--json"],
                            capture_output=True, text=True, env=env)
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            str(root / "tests")], capture_output=True, text=True, env=env,
                           timeout=900)
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-3000:]
    return listed.stdout, tests.stdout


@pytest.mark.slow
def test_generated_plugin_installs_and_passes(tmp_path):
    listed, tests = _install_and_test(tmp_path, "halve")
    root = tmp_path / "gradpipe-halve"
    assert {p.name for p in root.iterdir()} >= {"pyproject.toml", "README.md",
                                                "gradpipe_halve", "tests"}
    assert '"distribution": "gradpipe-halve"' in listed
    assert "3 passed" in tests


@pytest.mark.slow
def test_a_plugin_of_transforms_and_an_update_rule_installs_and_passes_its_tests(tmp_path):
    """--component and --rule, repeated: each component in the module, in the name
    index, with its own test (the rule's: its numbers against a closed form, and its
    step count); the contract test expects them all, the rule converging as an update
    rule must; the README names them and builds a pipeline with the rule."""
    listed, tests = _install_and_test(tmp_path, "tools", "--component", "halve",
                                      "--component", "clip-half", "--rule", "steady")
    root = tmp_path / "gradpipe-tools"
    assert sorted(p.name for p in (root / "tests").glob("test_*.py")) == [
        "test_clip_half.py", "test_contract.py", "test_halve.py", "test_steady.py"]
    (plugin,) = [p for p in json.loads(listed) if p["distribution"] == "gradpipe-tools"]
    assert plugin["status"] == "loaded" and plugin["components"] == {
        "transform": ["halve", "clip_half", "steady"]}
    pyproject = (root / "pyproject.toml").read_text()
    assert ('"transform.halve" = "gradpipe_tools"\n"transform.clip_half" = "gradpipe_tools"\n'
            '"transform.steady" = "gradpipe_tools"') in pyproject
    readme = (root / "README.md").read_text()
    assert "the transforms `halve`, `clip_half` and the `steady` update rule" in readme
    assert 'kind = "steady"\nlearning_rate = 0.001' in readme
    # the contract suite on all three, the entry point and one behaviour test each
    assert "7 passed" in tests


@pytest.mark.parametrize("flags, expected", [
    (["--component", "halve", "--component", "halve"], "halve is given twice"),
    (["--component", "halve", "--rule", "halve"], "halve is given twice"),
    (["--component", "two words"], "component name 'two words' must be letters"),
    (["--rule", "9lives"], "rule name '9lives' must be letters"),
])
def test_bad_components(tmp_path, flags, expected):
    made = subprocess.run([sys.executable, "-m", "gradpipe.cli", "new-plugin", "tools",
                           *flags, "--directory", str(tmp_path)], capture_output=True, text=True)
    assert made.returncode == 1 and expected in made.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_generated_wheel_has_valid_metadata_and_the_name_index(tmp_path):
    """The wheel of the generated package: metadata the package index accepts (every
    classifier a real trove classifier), the plugin's entry point and its name index,
    the `test` extra its README names, and a .gitignore."""
    import zipfile

    import trove_classifiers
    from packaging.metadata import Metadata, parse_email

    made = subprocess.run([sys.executable, "-m", "gradpipe.cli", "new-plugin", "halve",
                           "--directory", str(tmp_path)], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    root = tmp_path / "gradpipe-halve"
    assert "dist/" in (root / ".gitignore").read_text().split()
    assert 'pip install -e ".[test]"' in (root / "README.md").read_text()
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                            "--no-build-isolation", "-w", str(tmp_path / "dist"), str(root)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp_path / "dist").glob("gradpipe_halve-0.1.0-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        info = "gradpipe_halve-0.1.0.dist-info"
        raw = archive.read(f"{info}/METADATA").decode()
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    metadata = Metadata.from_raw(parse_email(raw)[0], validate=True)
    assert metadata.name == "gradpipe-halve" and str(metadata.version) == "0.1.0"
    assert metadata.classifiers and not set(metadata.classifiers) - set(
        trove_classifiers.classifiers)
    assert "test" in (metadata.provides_extra or [])
    assert any(str(r).startswith("gradpipe>=") for r in metadata.requires_dist or [])
    assert "[gradpipe]\nhalve = gradpipe_halve" in entry_points
    assert "[gradpipe.components]\ntransform.halve = gradpipe_halve" in entry_points


def test_existing_directory_is_refused(tmp_path):
    (tmp_path / "gradpipe-halve").mkdir()
    made = subprocess.run([sys.executable, "-m", "gradpipe.cli", "new-plugin", "halve",
                           "--directory", str(tmp_path)], capture_output=True, text=True)
    assert made.returncode == 1 and "already exists" in made.stderr


@pytest.mark.parametrize("bad", ["9lives", "has space"])
def test_bad_names(tmp_path, bad):
    made = subprocess.run([sys.executable, "-m", "gradpipe.cli", "new-plugin", bad,
                           "--directory", str(tmp_path)], capture_output=True, text=True)
    assert made.returncode == 1 and "must be letters" in made.stderr


def test_next_step_is_a_command_that_works_and_clashes_are_named(tmp_path):
    """The printed install command names the folder (not a package on the index) with
    the test extra, and a name a built-in already has is pointed out at once."""
    made = subprocess.run([sys.executable, "-m", "gradpipe.cli", "new-plugin", "adam"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert ('python -m pip install -e "./gradpipe-adam[test]" && '
            "python -m pytest ./gradpipe-adam/tests") in made.stdout
    assert "transform 'adam' already exists" in made.stdout
    assert "'gradpipe-adam>adam'" in made.stdout
    # components and rules by the names the package registers (lower case, "_")
    made = subprocess.run([sys.executable, "-m", "gradpipe.cli", "new-plugin", "tools",
                           "--component", "Clip-By-Value", "--rule", "SGD", "--rule", "mine"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    notes = [line for line in made.stdout.splitlines() if line.startswith("note:")]
    assert [n.split("'")[1] for n in notes] == ["clip_by_value", "sgd"], made.stdout
