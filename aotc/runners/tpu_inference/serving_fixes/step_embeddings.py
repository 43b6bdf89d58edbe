"""Embeddings into the step, for every multimodal model the fixes serve.

Each scheduled piece of an encoder output is sliced (`jit_dynamic_slice` by image size and prefill chunk), the
pieces joined and padded to the step's token bucket (`jit_concatenate`, `jit_broadcast_in_dim` by how many
pieces and rows). The fix copies each piece into one buffer of the bucket's rows with two jitted functions
keyed by the token bucket and the encoder output's rows only (`empty_embedding_rows`, `place_encoder_rows`;
planned `beyond_warmup`), and hands the merger that one buffer, as the stack's warm-up does. A model whose
merge needs the stack's own pieces opts out (llava.TAKES_ONE_BUFFER).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

from .common import WholeEncoderOutput, attribute_set, wrap_once
from .llava import TAKES_ONE_BUFFER


def fix(module) -> None:
    wrap_once(module.MultiModalManager, gather_mm_embeddings=_into_one_buffer)


@dataclass(frozen=True)
class RowRange:
    """Rows [start, start + count) of an encoder output, not yet sliced on the device."""

    array: Any
    start: int
    count: int


@dataclass(frozen=True)
class EncoderRows:
    """An encoder output's `rows` rows from `start` (all of them, or a padded output's image rows)."""

    array: Any
    rows: int
    start: int = 0

    @classmethod
    def of(cls, output) -> EncoderRows:
        if isinstance(output, WholeEncoderOutput):
            return cls(output.array, output.count, output.start)
        return cls(output, output.shape[0])

    def __getitem__(self, rows: slice) -> RowRange:
        start, stop, step = rows.indices(self.rows)
        assert step == 1, "encoder rows are taken in order"
        return RowRange(self.array, self.start + start, stop - start)


class EncoderRowsView:
    """The runner's encoder cache as gather_mm_embeddings reads it, handing out row ranges."""

    def __init__(self, cache: dict):
        self.cache = cache

    def get(self, key, default=None):
        return EncoderRows.of(self.cache[key]) if key in self.cache else default

    def __getitem__(self, key):
        return EncoderRows.of(self.cache[key])


def _into_one_buffer(gather):
    signature = inspect.signature(gather)

    @functools.wraps(gather)
    def gather_into_one_buffer(manager, *args, **kwargs):
        runner = manager.runner
        if not getattr(runner.embed_input_ids_fn, TAKES_ONE_BUFFER, True):
            return gather(manager, *args, **kwargs)
        with attribute_set(runner, "encoder_cache", EncoderRowsView(runner.encoder_cache)):
            pieces, is_mm_embed = gather(manager, *args, **kwargs)
        if pieces is None:
            return pieces, is_mm_embed
        rows = signature.bind(manager, *args, **kwargs).arguments["target_pad_len"]
        return [placed_rows(runner.mesh, pieces, rows)], is_mm_embed

    return gather_into_one_buffer


def embedding_sharding(mesh):
    """The sharding the stack's warm-up gives the merger's embeddings (_precompile_input_embeddings_merger)."""
    from jax.sharding import NamedSharding, PartitionSpec
    from tpu_inference.layers.common.sharding import ShardingAxisName

    return NamedSharding(mesh, PartitionSpec(ShardingAxisName.ATTN_DATA, None))


def placed_rows(mesh, pieces: list[RowRange], rows: int):
    """The pieces one after another in a (rows, width) buffer, zeros after them: what the stack's
    flatten_pad_mm_embeds makes of the sliced pieces."""
    first = pieces[0].array
    sharding = embedding_sharding(mesh)
    buffer = empty_embedding_rows(rows, first.shape[-1], first.dtype, sharding)
    offset = 0
    for piece in pieces:
        buffer = place_encoder_rows(buffer, piece.array, piece.start, offset, piece.count, sharding)
        offset += piece.count
    return buffer


@functools.cache
def _jitted():
    import jax
    import jax.numpy as jnp

    @functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
    def empty_embedding_rows(rows, width, dtype, sharding):
        return jax.lax.with_sharding_constraint(jnp.zeros((rows, width), dtype), sharding)

    @functools.partial(jax.jit, static_argnums=(5,))
    def place_encoder_rows(buffer, encoder_rows, src_start, dst_start, count, sharding):
        encoder_rows = encoder_rows.reshape(-1, encoder_rows.shape[-1])  # a tiled output's tiles, in order
        index = jnp.arange(buffer.shape[0])
        source = jnp.clip(index - dst_start + src_start, 0, encoder_rows.shape[0] - 1)
        inside = (index >= dst_start) & (index < dst_start + count)
        placed = jnp.where(inside[:, None], encoder_rows[source].astype(buffer.dtype), buffer)
        return jax.lax.with_sharding_constraint(placed, sharding)

    return empty_embedding_rows, place_encoder_rows


def empty_embedding_rows(rows: int, width: int, dtype, sharding):
    return _jitted()[0](rows, width, dtype, sharding)


def place_encoder_rows(buffer, encoder_rows, src_start: int, dst_start: int, count: int, sharding):
    return _jitted()[1](buffer, encoder_rows, src_start, dst_start, count, sharding)
