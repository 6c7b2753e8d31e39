"""Acceptance length (AL) and retention of speculative decoding, as SPEED-Bench defines them.

Load with `evaluate.load("<path to this folder>")`. Inputs are per request: `accepted`, the number of accepted draft
tokens of every verification round; optionally `reference_accepted`, the same for the reference run (e.g. the
`full` cache policy) on the same prompts, for retention.
"""

import datasets
import evaluate

_DESCRIPTION = """
AL of one request = tokens emitted per target verification round counting the bonus token (accepted + 1),
averaged over its rounds; the metric averages requests. Retention = AL / reference AL on the same prompts
(mean of the per-request ratios, and the ratio of the means).
"""

_KWARGS = """
Args:
    accepted (`list[list[int]]`): accepted draft tokens per round, one list per request.
    reference_accepted (`list[list[int]]`, *optional*): the same for the reference policy.
Returns:
    acceptance_length, per_request (list), and with a reference: reference_acceptance_length,
    retention (ratio of mean ALs), retention_per_request (list), retention_min, retention_max.
Example:
    >>> metric = evaluate.load("rift_hf/metrics/acceptance_length")
    >>> metric.compute(accepted=[[3, 0, 11]], reference_accepted=[[11, 11]])["retention"]
    0.4166...
"""


def _al(rounds):
    if not rounds:
        raise ValueError("a request has no verification rounds; drop it or run generation first.")
    return sum(a + 1 for a in rounds) / len(rounds)


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS)
class AcceptanceLength(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS,
            features=[
                datasets.Features({"accepted": datasets.Sequence(datasets.Value("int32"))}),
                datasets.Features(
                    {
                        "accepted": datasets.Sequence(datasets.Value("int32")),
                        "reference_accepted": datasets.Sequence(datasets.Value("int32")),
                    }
                ),
            ],
        )

    def _compute(self, accepted, reference_accepted=None):
        per_request = [_al(r) for r in accepted]
        result = {"acceptance_length": sum(per_request) / len(per_request), "per_request": per_request}
        if reference_accepted is not None:
            reference = [_al(r) for r in reference_accepted]
            ratios = [a / b for a, b in zip(per_request, reference, strict=True)]
            result.update(
                {
                    "reference_acceptance_length": sum(reference) / len(reference),
                    "retention": result["acceptance_length"] / (sum(reference) / len(reference)),
                    "retention_per_request": ratios,
                    "retention_min": min(ratios),
                    "retention_max": max(ratios),
                }
            )
        return result
