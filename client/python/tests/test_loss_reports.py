"""Per-source loss reports (protocol v7) with a real torch: a tiny model's real per-token
cross-entropy on served `best_fit` batches (labels of -100, padding or masked, do not count) turned into
per-source reports by `per_source_loss`, checked against a direct per-source computation, sent
with `Client.report`, and counted by the real daemon's `/metrics`; which rank of a model-parallel
group reports.

CI runs these with torch installed (`DSPREP_REQUIRE_EXTRAS=1`); elsewhere they skip without it."""

import time

from extras import extra

torch = extra("torch")

from dsprep_client import Client, per_source_loss  # noqa: E402
from dsprep_client.parallel import reports_loss  # noqa: E402

NAMES = ["fineweb-edu", "c4", "zyda-2", "the-stack-v2", "finemath"]


def tiny_model_loss(input_ids, labels):
    """A tiny model's per-token cross-entropy over ids folded into 997 classes."""
    torch.manual_seed(0)
    vocab = 997
    model = torch.nn.Sequential(torch.nn.Embedding(vocab, 16), torch.nn.Linear(16, vocab))
    logits = model(input_ids % vocab)
    target = torch.where(labels == -100, labels, labels % vocab)
    return torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="none", ignore_index=-100)


def test_per_source_loss_equals_a_direct_computation_and_the_daemon_counts_the_report(daemon_factory, best_fit_recipe):
    daemon = daemon_factory(recipe=best_fit_recipe, world_size=1, micro_batch=2, prefetch=4, metrics=True)
    client = Client(daemon.endpoint, rank=0, world_size=1, timeout=10)
    sent = {s: 0 for s in range(len(NAMES))}
    masked = 0
    for step in range(8):
        batch = client.batch_at(step)
        ids = torch.from_numpy(batch.input_ids.astype("int64"))
        labels = torch.from_numpy(batch.labels).clone()
        labels[:, :7] = -100  # as a trainer that masks a prompt; best_fit's padding is -100 too
        sources = torch.from_numpy(batch.input_sources)
        loss = tiny_model_loss(ids, labels).detach()
        got = per_source_loss(loss, sources, labels)
        masked += int((labels == -100).sum())
        for s in range(len(NAMES)):
            where = (sources == s) & (labels != -100)
            if int(where.sum()) == 0:
                assert s not in got
                continue
            loss_sum, tokens = got[s]
            assert tokens == int(where.sum())
            assert abs(loss_sum - float(loss[where].double().sum())) < 1e-6 * max(1.0, loss_sum)
        assert sum(t for _, t in got.values()) == int((labels != -100).sum())
        assert client.report(step, got)
        for s, (_, tokens) in got.items():
            sent[s] += tokens
    assert masked >= 8 * 2 * 7

    def counted(s):
        return daemon.metric(f'dsprep_source_loss_tokens{{source="{NAMES[s]}"}}')

    deadline = time.monotonic() + 20
    while daemon.metric("dsprep_loss_reports_total") < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert daemon.metric("dsprep_loss_reports_total") == 8
    assert [counted(s) for s in range(len(NAMES))] == [float(sent[s]) for s in range(len(NAMES))]
    client.close()


def test_one_rank_of_a_model_parallel_group_reports():
    # World 8 with tp 2, pp 2: data-parallel 2; the last stage (ranks 4..8) with tensor rank 0.
    assert [r for r in range(8) if reports_loss(r, 8, tensor=2, pipeline=2)] == [4, 6]
    assert [r for r in range(8) if reports_loss(r, 8, tensor=2, pipeline=2, order="tp-cp-pp-dp")] == [2, 6]
    assert all(reports_loss(r, 4) for r in range(4))


def test_a_shape_mismatch_is_refused_by_name():
    try:
        per_source_loss(torch.zeros(2, 3), torch.zeros(2, 4, dtype=torch.int64), torch.zeros(2, 3))
    except ValueError as e:
        assert str(e) == "loss (2, 3), sources (2, 4) and labels (2, 3) must have one shape (one value per input token)"
    else:
        raise AssertionError("refused")
