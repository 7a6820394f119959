"""A small seeded sample of benchmarks/fuzz_lint.py: mutants of the fixture
scripts and grammar-generated programs through the real runner; no crash,
hang, traceback or lost file. The full 10,000-input run is the benchmark."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def fuzz_module():
    if "fuzz_lint" in sys.modules:
        return sys.modules["fuzz_lint"]
    spec = importlib.util.spec_from_file_location("fuzz_lint", REPO / "benchmarks" / "fuzz_lint.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_lint"] = module   # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_seeded_sample_has_no_failures(tmp_path):
    fuzz = fuzz_module()
    figures = fuzz.run(count=120, seed=20261123, grammar_share=0.25, batch_size=60, jobs=2, time_limit=60.0,
                       keep=tmp_path / "failures", quiet=True)
    assert figures.failures == []
    assert figures.inputs >= 120
    # The sample reaches the analysis (not only syntax errors) and the rules fire.
    assert figures.outcomes["analysed"] >= 40 and sum(figures.findings.values()) > 0


def test_a_failure_is_caught(tmp_path, monkeypatch):
    """The harness itself can fail: an internal error in one input is reported."""
    fuzz = fuzz_module()
    import ddpcheck.lint.analyze as analyze_module

    real = analyze_module.analyze

    def flaky(text, path, settings, project=None):
        if path.endswith("mutant00001.py"):
            raise RuntimeError("planted bug")
        return real(text, path, settings, project)

    monkeypatch.setattr(analyze_module, "analyze", flaky)
    inputs = [(f"mutant{n:05d}.py", fuzz.PRELUDE + fuzz.EPILOGUE, {}) for n in range(3)]
    figures = fuzz.Figures()
    fuzz.lint_batch(inputs, tmp_path / "batch", jobs=1, time_limit=60.0, figures=figures, keep=None)
    assert [why for _, why in figures.failures] == [
        "internal: internal error (RuntimeError: planted bug); please report this"]
