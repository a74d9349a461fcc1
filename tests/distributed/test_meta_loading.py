"""learner.strategy=fsdp2 loads the policy without materialising it whole on any rank but 0: the other ranks
build it on the meta device, shard it and take only their shards from rank 0 (the reference too); and the ranks
split the no-grad passes that prepare a batch."""

import pytest
import ranks
import torch


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])  # 3: uneven shards (few dimensions divide by 3)
def test_sharded_ranks_hold_only_their_shards_of_rank_0s_weights(nano_dir, tmp_path, world):
    rank0, *others = ranks.spawn(ranks.sharded_start, world, tmp_path, nano_dir, world, timeout_s=120.0)
    assert rank0["loaded"] and not any(rank["loaded"] for rank in others)  # the other ranks read no weights
    for part in ("policy", "reference"):
        held = [rank[part] for rank in (rank0, *others)]
        assert sum(local for local, *_ in held) == held[0][1]  # the shards partition every tensor
        assert all(sharded and local <= share for local, _, share, sharded in held)  # 1/world of its rows each
    for rank in (rank0, *others):
        assert rank["tied"] and rank["reference_frozen"] and rank["mirror_is_loaded"]
        assert rank["buffers"] and all(torch.equal(b, rank0["loaded_state"][k]) for k, b in rank["buffers"].items())
    # what every rank holds is rank 0's loaded model, bit for bit, buffers (rotary frequencies) included
    loaded = rank0["loaded_state"]
    for gathered in (rank0["gathered"], rank0["gathered_ref"]):
        assert gathered.keys() == loaded.keys()
        assert all(torch.equal(gathered[k], loaded[k]) for k in loaded)


def test_sharded_ranks_split_the_no_grad_passes_and_gather_them_in_row_order(tmp_path):
    rank0, rank1 = ranks.spawn(ranks.sharded_scores, 2, tmp_path, 5)
    assert rank0["scored"] == [[0, 1, 2]] and rank1["scored"] == [[3, 4, 4]]  # equal shares: the last row again
    for rank in (rank0, rank1):  # every rank ends with every row's result, in order, the padding dropped
        assert torch.equal(rank["values"], torch.arange(5)[:, None].repeat(1, 3).float() * 10)
        assert rank["nothing"] is None
