"""The traffic sweep's step grid: every (request bucket, token bucket) pair a scheduler step can pad to is
reached by exactly one planned step, for any matrix entry (expected pairs by brute force over the entry's
own buckets, never a snapshot)."""

import random

from aotc.matrix import Entry
from aotc.runners import traffic
from aotc.runners.tpu_inference.plan.buckets import paddings

VOCAB = 1000


def entry(seqs: int, length: int, budget: int, gap: int = 0) -> Entry:
    return Entry(name="e", model_name="m", model="m", revision="main", runner="tpu-inference", device="cpu",
                 accelerator="v6e-1", dtype="bfloat16", max_model_len=length, max_num_seqs=seqs,
                 max_num_batched_tokens=budget, tensor_parallel_size=1,
                 env={"VLLM_TPU_BUCKET_PADDING_GAP": str(gap)} if gap else {})


def limits(e: Entry) -> traffic.Limits:
    p = paddings(e)
    return traffic.Limits.of(e, p["reqs"], p["tokens"], token_buckets=p["tokens"])


def padded(buckets, x: int) -> int:
    return min(b for b in buckets if b >= x)


def reachable(lim: traffic.Limits) -> set[tuple[int, int]]:
    """Every (request bucket, token bucket) of a step of n requests and t tokens: n <= t (a request holds at
    least one token), t within the budget and the prompts' room."""
    room = lim.max_model_len - traffic.STEP_NEW_TOKENS
    return {(padded(lim.request_buckets, n), padded(lim.token_buckets, t))
            for n in range(1, lim.max_num_seqs + 1)
            for t in range(n, min(lim.max_num_batched_tokens, n * room) + 1)}


def cases():
    rng = random.Random(0)
    fixed = [(seqs, 128, 64) for seqs in (1, 4, 8, 12, 16, 32)] + [(12, 192, 96), (16, 512, 384, 64), (64, 2048, 512)]
    drawn = [(rng.randint(1, 96), rng.choice([64, 128, 200, 1024]), rng.choice([16, 48, 64, 96, 128, 256, 384]),
              rng.choice([0, 0, 32, 64])) for _ in range(60)]
    return [entry(*c) for c in fixed + drawn]


def test_the_step_grid_reaches_every_bucket_pair_a_step_can_pad_to():
    for e in cases():
        lim = limits(e)
        shapes = traffic.step_shapes(lim)
        pairs = [(padded(lim.request_buckets, n), padded(lim.token_buckets, t)) for n, t in shapes]
        assert len(pairs) == len(set(pairs)), e.name  # one step per pair
        assert set(pairs) == reachable(lim), (e.max_num_seqs, e.max_model_len, e.max_num_batched_tokens, e.env)


def test_each_grid_batch_is_one_prefill_step_of_its_shape():
    for e in cases()[:20]:
        lim = limits(e)
        batches = traffic.step_batches(random.Random(1), lim, VOCAB)
        shapes = traffic.step_shapes(lim)
        assert len(batches) == 2 * len(shapes)  # without and with a prompt-logprob request
        for (n, t), plain, with_prompt_logprobs in zip(shapes, batches[::2], batches[1::2]):
            for batch in (plain, with_prompt_logprobs):
                assert len(batch) == n and sum(len(r.prompt) for r in batch) == t
                assert all(0 < len(r.prompt) <= lim.max_model_len - traffic.STEP_NEW_TOKENS for r in batch)
            assert not any(r.sampling.get("prompt_logprobs") for r in plain)
            assert sum(1 for r in with_prompt_logprobs if r.sampling.get("prompt_logprobs")) == 1


def test_the_grid_comes_on_top_of_the_same_coverage_and_random_requests():
    e = entry(16, 128, 64)
    p = paddings(e)
    without = traffic.Limits.of(e, p["reqs"], p["tokens"])
    assert traffic.step_shapes(without) == []
    for requests in (8, 40, 120):
        plain = traffic.plan_traffic(3, requests, without, VOCAB)
        gridded = traffic.plan_traffic(3, requests, limits(e), VOCAB)
        assert sum(map(len, plain)) >= requests
        assert gridded[:len(plain)] == plain  # --traffic N buys the same sweep; the grid is extra
        assert len(gridded) - len(plain) == 2 * len(traffic.step_shapes(limits(e)))


def test_image_batches_fit_the_model_and_place_one_placeholder_per_image():
    """Each image size is sent alone, then mixed with text prompts; every image prompt holds its images'
    placeholders in order and, with each image's tokens, leaves room for the output within max_model_len."""
    import dataclasses

    placeholder = (1000, 1001, 1002)
    sizes = ((56, 56, 4), (112, 84, 12))
    for seqs, length in ((8, 128), (2, 64), (16, 512)):
        lim = dataclasses.replace(limits(entry(seqs, length, 64)), image_sizes=sizes, image_placeholder=placeholder,
                                  images_per_prompt=2)
        batches = traffic.image_batches(random.Random(seqs), lim, VOCAB)
        assert [[r.images[0][:2] for r in batch] for batch in batches[:len(sizes)]] == [[s[:2]] for s in sizes]
        mixed = [r for batch in batches[len(sizes):] for r in batch]
        assert any(r.images for r in mixed) and any(not r.images for r in mixed)
        for r in (r for batch in batches for r in batch if r.images):
            assert r.prompt.count(placeholder[1]) == len(r.images)
            tokens = {(h, w): t for h, w, t in sizes}
            expanded = len(r.prompt) + sum(tokens[h, w] - 1 for h, w, _ in r.images)
            assert expanded + traffic.MAX_NEW_TOKENS <= length, (seqs, length, r)
    assert traffic.image_batches(random.Random(0), limits(entry(8, 128, 64)), VOCAB) == []


def test_two_images_share_a_prompt_only_where_both_fit():
    """Images of half max_model_len's tokens (a processor bound above the step budget): a prompt drawn with two
    keeps the first alone; small ones still pair up."""
    import dataclasses

    placeholder, sizes = (1000, 1001, 1002), ((56, 56, 4), (224, 224, 64))
    lim = dataclasses.replace(limits(entry(8, 128, 64)), image_sizes=sizes, image_placeholder=placeholder,
                              images_per_prompt=2)
    prompts = [r for seed in range(20) for batch in traffic.image_batches(random.Random(seed), lim, VOCAB)
               for r in batch if r.images]
    tokens = {(h, w): t for h, w, t in sizes}
    for r in prompts:
        expanded = len(r.prompt) + sum(tokens[h, w] - 1 for h, w, _ in r.images)
        assert expanded + traffic.MAX_NEW_TOKENS <= 128, r
    assert not any([s[:2] for s in r.images].count((224, 224)) == 2 for r in prompts)
    assert any(len(r.images) == 2 for r in prompts)
