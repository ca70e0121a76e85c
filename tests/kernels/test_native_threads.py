"""The native products' thread pool under the uses that stress it: products from several
Python threads at once (one job holds the pool, the others run alone), and a forked child,
which has no workers until its first product starts them."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from interlock.kernels import REGISTRY, quant
from interlock.kernels.native import unavailable

WHY_NOT = unavailable("cpu")
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"native kernels: {WHY_NOT}")


def product() -> tuple[torch.Tensor, object]:
    """A Q8_0 weight of 40 strips and its native product."""
    gen = torch.Generator().manual_seed(7)
    q = torch.randint(-127, 128, (640, 256), generator=gen, dtype=torch.int8)
    scale = torch.rand(640, 256 // 32, generator=gen).to(torch.float16).to(torch.float32)
    weight = quant.pack(q, scale, None, quant.FORMATS["Q8_0"])
    return weight, REGISTRY.select("quantized_linear", "cpu", "float32", force="native").fn


def test_products_from_several_threads_at_once_are_each_right() -> None:
    weight, linear = product()
    inputs = [torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows))
              for rows in (1, 3, 8, 17)]
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        expected = [linear(x, weight, "Q8_0", None) for x in inputs]
        torch.set_num_threads(2)
        wrong: list[int] = []

        def hammer(index: int) -> None:
            for _ in range(200):
                if not torch.equal(linear(inputs[index], weight, "Q8_0", None),
                                   expected[index]):
                    wrong.append(index)
                    return

        workers = [threading.Thread(target=hammer, args=(i,)) for i in range(len(inputs))]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=120)
        assert not any(w.is_alive() for w in workers), "a product never finished"
        assert wrong == []
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_starts_its_own_workers() -> None:
    weight, linear = product()
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(1))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        expected = linear(x, weight, "Q8_0", None)  # the parent's pool is running now
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its products must neither hang nor differ
            ok = torch.equal(linear(x, weight, "Q8_0", None), expected)
            os.write(write, b"1" if ok else b"0")
            os._exit(0)
        os.close(write)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert os.read(read, 1) == b"1"
        os.close(read)
    finally:
        torch.set_num_threads(before)


def test_the_read_probe_sums_every_word_at_any_thread_count() -> None:
    """read_words (the bench's read-bandwidth probe) reads every word once, whatever the
    threads' shares: 100,003 words are not whole 4 KiB units."""
    from interlock.kernels.native import ops

    buffer = torch.arange(1, 100_004, dtype=torch.int64)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            assert ops.read_words(buffer) == 100_003 * 100_004 // 2
        assert ops.read_words(torch.full((4,), -1, dtype=torch.int64)) == -4  # modulo 2**64
        with pytest.raises(ops.NativeArgumentError, match="contiguous torch.int64"):
            ops.read_words(buffer.to(torch.int32))
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("window", [None, 3])
def test_decode_attention_shares_its_heads_and_gives_one_threads_bits(window: int | None) -> None:
    """A batch's (sequence, head) pairs are parts of one job, each part with scores of its
    own: at two threads bitwise what one thread gives, a sequence of no keys included."""
    from test_quantized_kernels import torch_threads

    attend = REGISTRY.select("paged_decode_attention", "cpu", "float32", force="native").fn
    gen = torch.Generator().manual_seed(11)
    caches = [torch.randn(40, 4, 2, 16, generator=gen) for _ in range(2)]
    lens = torch.tensor([13, 0, 29, 1, 32, 7], dtype=torch.int32)
    tables = torch.stack([torch.randperm(40, generator=gen)[:8] for _ in lens]).int()
    q = torch.randn(len(lens), 6, 16, generator=gen)
    outs = []
    for threads in (1, 2):
        with torch_threads(threads):
            outs.append(attend(q, *caches, tables, lens, 0.25, window))
    assert torch.equal(outs[0], outs[1])
    assert not outs[0][1].any()  # no keys: zeros
