"""CUDA-graph record/replay/reset decisions (pure function, no GPU)."""

from __future__ import annotations

from trtforge.runtime._graph_state import GraphAction, GraphState, decide, record_failed

A, B = ((4, 64),), ((8, 64),)


def _run(keys, **kw):
    state, actions = GraphState(), []
    for key in keys:
        d = decide(
            state,
            key,
            enabled=kw.get("enabled", True),
            memory_generation=kw.get("gen", 1),
            dynamic_outputs=kw.get("dds", False),
            warmup=kw.get("warmup", 1),
        )
        actions.append((d.action, d.drop))
        state = d.state
    return actions, state


def test_disabled_is_always_eager():
    actions, state = _run([A, A, A], enabled=False)
    assert actions == [(GraphAction.EAGER, False)] * 3 and not state.captured


def test_warmup_then_record_then_replay():
    actions, state = _run([A, A, A, A])
    assert [a for a, _ in actions] == [
        GraphAction.WARMUP,
        GraphAction.RECORD,
        GraphAction.REPLAY,
        GraphAction.REPLAY,
    ]
    assert state.captured and state.key == A


def test_longer_warmup():
    actions, _ = _run([A, A, A, A], warmup=2)
    assert [a for a, _ in actions] == [
        GraphAction.WARMUP,
        GraphAction.WARMUP,
        GraphAction.RECORD,
        GraphAction.REPLAY,
    ]


def test_shape_change_drops_the_graph_and_warms_up_again():
    actions, state = _run([A, A, B, B, B])
    assert actions[2] == (GraphAction.WARMUP, True)
    assert actions[3] == (GraphAction.RECORD, False)
    assert actions[4] == (GraphAction.REPLAY, False)
    assert state.key == B


def test_alternating_shapes_never_record():
    actions, _ = _run([A, B, A, B, A, B])
    assert all(a is GraphAction.WARMUP for a, _ in actions)


def test_memory_move_forces_recapture_without_new_warmup():
    s = GraphState()
    for _ in range(2):
        s = decide(s, A, enabled=True, memory_generation=1).state
    assert s.captured
    d = decide(s, A, enabled=True, memory_generation=2)
    assert d.action is GraphAction.RECORD and d.drop and d.state.memory_generation == 2


def test_data_dependent_outputs_never_capture_and_drop_existing():
    s = decide(
        decide(GraphState(), A, enabled=True, memory_generation=1).state, A, enabled=True, memory_generation=1
    ).state
    d = decide(s, A, enabled=True, memory_generation=1, dynamic_outputs=True)
    assert d.action is GraphAction.EAGER and d.drop and not d.state.captured


def test_failed_key_stays_eager_other_keys_still_record():
    s = record_failed(GraphState(key=A, captured=True, warm_calls=2), A)
    assert not s.captured and A in s.failed
    assert decide(s, A, enabled=True, memory_generation=1).action is GraphAction.EAGER
    s2 = decide(s, B, enabled=True, memory_generation=1).state
    assert decide(s2, B, enabled=True, memory_generation=1).action is GraphAction.RECORD


def test_decide_does_not_mutate_its_input():
    s = GraphState()
    decide(s, A, enabled=True, memory_generation=1)
    assert s == GraphState()
