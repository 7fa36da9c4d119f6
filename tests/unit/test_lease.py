"""Pure lease + fencing arithmetic: a transcript of a handover and properties of the timing rules."""

from hypothesis import given
from hypothesis import strategies as st

from raft.lease import (
    LeaseRecord,
    acquire,
    check_fence,
    contender_may_acquire_at_ms,
    holder_valid_until_ms,
    release,
    renew,
)


def test_handover_transcript():
    rec = LeaseRecord()
    out = acquire(rec, "n1", expected_version=0, log_index=5, duration_ms=3000)
    assert out.ok and out.record == LeaseRecord("n1", 5, 1, 3000)
    rec = out.record
    # n2 read version 1 and waited; n1 renewed meanwhile: n2's CAS fails deterministically.
    rec = renew(rec, "n1", 5).record
    assert rec.version == 2
    late = acquire(rec, "n2", expected_version=1, log_index=9, duration_ms=3000)
    assert not late.ok and late.record is rec and "expected 1" in late.reason
    # n1 stops renewing; n2 acquires at version 2 with a higher epoch.
    rec = acquire(rec, "n2", expected_version=2, log_index=12, duration_ms=3000).record
    assert (rec.holder, rec.epoch, rec.version) == ("n2", 12, 3)
    # The old holder can neither renew nor release with its old epoch.
    assert not renew(rec, "n1", 5).ok
    assert not release(rec, "n1", 5).ok
    assert release(rec, "n2", 12).record.holder == ""


def test_acquire_rejects_non_increasing_epoch_and_bad_input():
    rec = LeaseRecord("n1", 10, 3)
    assert not acquire(rec, "n2", 3, 10, 3000).ok
    assert not acquire(rec, "", 3, 11, 3000).ok
    assert not acquire(rec, "n2", 3, 11, 0).ok
    assert acquire(rec, "n2", 3, 11, 3000).ok


def test_fence_rules():
    assert check_fence(0, "", 1, "n1").accepted
    assert not check_fence(5, "n1", 4, "n2").accepted
    assert not check_fence(5, "n1", 5, "n2").accepted
    assert check_fence(5, "n1", 5, "n1").accepted
    assert check_fence(5, "n1", 6, "n2").accepted


@given(
    t_send=st.integers(0, 10**9),
    obs_delay=st.integers(0, 10_000),
    duration=st.integers(100, 60_000),
    rho=st.floats(0.0, 0.1),
    margin=st.integers(0, 1_000),
    holder_rate=st.floats(0.0, 1.0),
    contender_rate=st.floats(0.0, 1.0),
)
def test_holder_window_ends_before_contender_may_acquire_in_real_time(
    t_send, obs_delay, duration, rho, margin, holder_rate, contender_rate
):
    """Clocks tick at rates within [1-rho, 1+rho] of real time. The holder's validity (on its
    clock) must end, in real time, no later than the contender may send acquire (on its clock)."""
    h_rate = 1 - rho + 2 * rho * holder_rate  # holder clock ticks per real ms
    c_rate = 1 - rho + 2 * rho * contender_rate
    holder_end_real = (holder_valid_until_ms(t_send, duration, rho, margin) - t_send) / h_rate
    # The contender observed the change obs_delay real ms after the holder sent it.
    contender_start_real = obs_delay + (contender_may_acquire_at_ms(0, duration, rho, margin)) / c_rate
    assert holder_end_real <= contender_start_real + 1e-6
