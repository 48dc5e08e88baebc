"""Mixture of Experts, all of it: routing, dispatch, the MoE layer, and expert offload.

    dispatch.py         how tokens reach experts: group by expert, run each expert once, combine; the backends
                        (loop, bmm, grouped_mm) and the rule that picks one per call. Pure functions
    layer.py            the routers (softmax top-k, group-limited sigmoid top-k) and SparseMoeBlock (router +
                        FusedExperts + shared expert) with its tensor / expert parallel split
    expert_cache.py     one layer's device slots in front of its host-resident experts, and the byte accounting
    offload.py          the offloading ExpertRunner: which experts are resident, fetch or compute a miss on the host
    coreset_rule.py     the coreset rules as data (fixed C, dMoE's cumulative rule), from the flag or config.json
    coreset.py          block expert coreset routing: a denoised block's positions route within C experts
    window_coreset.py   dMoE's cumulative rule: every 32-position window routes within its own coreset
    offload_context.py  the step's blocks (and windows) that offload and coreset routing read, set around a
                        forward only then

Knows nothing of requests or the engine (the engine installs offload and sets its context, see engine/experts).
"""
