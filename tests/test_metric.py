import pathlib

import pytest

evaluate = pytest.importorskip("evaluate")

METRIC = pathlib.Path(__file__).resolve().parent.parent / "rift_hf" / "metrics" / "acceptance_length"


def test_acceptance_length_metric_loads_and_computes():
    metric = evaluate.load(str(METRIC))
    out = metric.compute(accepted=[[3, 0, 11], [1]], reference_accepted=[[11, 11], [3, 3]])
    assert out["per_request"] == [(4 + 1 + 12) / 3, 2.0]
    assert out["acceptance_length"] == pytest.approx(((17 / 3) + 2) / 2)
    assert out["retention_per_request"] == pytest.approx([(17 / 3) / 12, 0.5])
    assert out["retention"] == pytest.approx(out["acceptance_length"] / 8)
    assert metric.compute(accepted=[[0, 0]])["acceptance_length"] == 1.0


def test_metric_path_points_at_the_installed_metric_and_its_card():
    import rift_hf

    path = pathlib.Path(rift_hf.metric_path())
    assert path == METRIC and (path / "README.md").read_text().startswith("---\ntitle: Acceptance length")
    metric = evaluate.load(rift_hf.metric_path())
    assert metric.compute(accepted=[[1, 1]])["acceptance_length"] == 2.0
    with pytest.raises(ValueError, match="available: acceptance_length"):
        rift_hf.metric_path("perplexity")
