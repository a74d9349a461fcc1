"""A user adds an estimator, loss, correction, aggregation and KL estimator without editing the library."""

import torch

from grpoplus.algo import AGGREGATIONS, CORRECTIONS, KL_ESTIMATORS, LOSSES, AlgoConfig, Correction, per_sequence, policy_loss


def test_user_components_plug_into_config_and_policy_loss():
    @LOSSES.register("test_neg_logp")
    def neg_logp(logp, logp_old, advantages, mask, **_):
        return -advantages * logp, {}

    @LOSSES.register("test_seq_sum")
    @per_sequence
    def seq_sum(logp, logp_old, advantages, mask, **_):
        return -(advantages * logp * mask).sum(-1), {}

    @CORRECTIONS.register("test_halve")
    def halve(mask, logp_cur, logp_old, logp_roll, advantages, **_):
        return Correction(torch.full_like(logp_old, 0.5), None, {"clipped_frac": torch.tensor(0.0)})

    @AGGREGATIONS.register("test_sum")
    def plain_sum(loss, mask, norm):
        return (loss * mask).sum()

    @KL_ESTIMATORS.register("test_zero")
    def zero_kl(logp, logp_ref, logp_old):
        return torch.zeros_like(logp)

    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.5]], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    cfg = AlgoConfig(loss="test_neg_logp", aggregation="test_sum", corrections=("test_halve",), beta=1.0,
                     kl_estimator="test_zero")
    loss, m = policy_loss(logp, logp, adv, mask, cfg, logp_roll=logp, logp_ref=logp)
    assert loss.item() == 0.5 * (1.0 + 2.0 - 0.5)
    assert m["correction/test_halve/clipped_frac"] == 0.0
    # a per-sequence loss is averaged over the N' responses, whatever cfg.aggregation says
    loss, _ = policy_loss(logp, logp, adv, mask, cfg.replace(loss="test_seq_sum", corrections=()), logp_ref=logp)
    assert loss.item() == (3.0 - 0.5) / 2
