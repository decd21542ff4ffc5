"""Costs: FLOPs (torch.utils.flop_counter, 2 per multiply-accumulate) and MACs, the papers'
"FLOPs", converted and written side by side."""

from __future__ import annotations

from fedorasflwr.costs import COST_CONVENTION, describe_flops, flops_to_macs, macs_to_flops


def test_flops_and_macs_convert_at_two_flops_per_mac():
    assert flops_to_macs(1_346_000) == 673_000
    assert isinstance(flops_to_macs(1_346_000), int)  # a count stays a count
    assert flops_to_macs(2.5e6) == 1.25e6  # a bound (float) stays a float
    assert macs_to_flops(371_439) == 742_878
    assert flops_to_macs(macs_to_flops(371_439)) == 371_439


def test_a_log_line_and_result_json_name_both_units():
    assert describe_flops(1_346_000) == "1.346 MFLOPs (0.673 MMACs)"
    assert describe_flops(268_368) == "0.2684 MFLOPs (0.1342 MMACs)"
    assert "2 x MACs" in COST_CONVENTION and "the papers call FLOPs" in COST_CONVENTION
