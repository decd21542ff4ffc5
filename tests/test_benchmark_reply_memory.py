"""``benchmarks/reply_memory.py --quick`` as a smoke test: an oversized packed reply is
refused before anything of it is decoded or copied (issue 42: the server's extra memory
for it stays under 2x the bytes sent), where unpacking it first took its size again."""

from __future__ import annotations

import pytest

from tests.test_benchmarks import run_quick


@pytest.mark.slow
def test_reply_memory_quick_refuses_an_oversized_reply_without_copying_it():
    saved = run_quick("reply_memory")
    head = saved["headline"]
    assert head["refused"] is True and head["reply_mb"] == 40
    server = saved["rows"]["server-path"]
    assert "exceeds the" in server["outcome"]
    sent = saved["sent_bytes"]
    assert server["traced_peak_bytes"] < 2 * sent
    assert server["rss_peak_extra_bytes"] < 2 * sent + (4 << 20)  # page granularity
    # the order of before: the reply unpacked first takes about its size again
    first = saved["rows"]["unpacked-first"]
    assert first["traced_peak_bytes"] > 0.9 * first["reply_bytes"]
