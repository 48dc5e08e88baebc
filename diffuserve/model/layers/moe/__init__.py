"""Mixture of Experts, all of it: routing, dispatch, the MoE layer, and expert offload.

    router.py           hidden states -> (weights, expert ids): softmax top-k and group-limited sigmoid top-k
    dispatch.py         how tokens reach experts: group by expert, run each expert once, combine. Pure functions
    layer.py            SparseMoeBlock (router + FusedExperts + shared expert) and its tensor / expert parallel split
    expert_cache.py     one layer's device slots in front of its host-resident experts, and the byte accounting
    offload.py          the offloading ExpertRunner: which experts are resident, fetch or compute a miss on the host
    offload_context.py  the step's blocks that offload reads, set around a forward only when offload is on

Knows nothing of requests or the engine (the engine installs offload and sets its context, see engine/experts).
"""
