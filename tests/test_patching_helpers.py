"""The per-thread helpers of dmlshim.patching the patches share: Reentry (a flag) and
ThreadStack (data handed down to the calls a wrapper makes)."""

from __future__ import annotations

import threading

from dmlshim.patching import Reentry, ThreadStack


def test_reentry_is_per_thread_and_counts_depth():
    guard = Reentry()
    seen = []
    with guard:
        with guard:
            assert guard.active
        assert guard.active
        worker = threading.Thread(target=lambda: seen.append(guard.active))
        worker.start()
        worker.join()
    assert not guard.active and seen == [False]


def test_thread_stack_nests_restores_and_is_per_thread():
    stack = ThreadStack()
    assert stack.top is None and stack.pop() is None
    seen = []
    with stack.pushed({"outer"}) as outer:
        assert stack.top is outer
        try:
            with stack.pushed("inner"):
                assert stack.top == "inner"
                raise KeyError("unwinds")
        except KeyError:
            pass
        assert stack.top is outer  # the outer value is back after an inner call, even failing

        def other_thread() -> None:
            seen.append(stack.top)
            stack.push(True)
            seen.append(stack.top)

        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
        assert stack.top is outer  # the other thread's push stayed there
    assert stack.top is None and seen == [None, True]
    stack.push(False)
    stack.push(True)
    assert stack.pop() is True and stack.top is False
