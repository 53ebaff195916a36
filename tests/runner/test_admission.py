"""Admission (gh_runner/admission.py): whether a lease or a job is taken, decided from plain values."""

from __future__ import annotations

import dataclasses

from gh_runner import admission
from gh_runner.admission import MIB, RunnerState, SlotHolder, Slots
from gh_wire.protocol import Job, LeaseRefusal, StartStateRef

from .peer import make_lease

IDLE = RunnerState(draining=False, hypervisor_up=True, hypervisor_reason=None, busy=0, slots=2,
                   labels=("lab",), images=("linux-tiny",), held=(("ss_1", 3),), can_pull=False)


def state(**changes: object) -> RunnerState:
    return dataclasses.replace(IDLE, **changes)  # type: ignore[arg-type]


def code(lease_state: RunnerState, **lease: object) -> LeaseRefusal | None:
    refusal = admission.lease_refusal(make_lease(str(lease.pop("attempt_id", "at_1")), **lease), lease_state)
    return None if refusal is None else refusal.code


def test_an_idle_runner_takes_a_lease_for_an_image_it_has() -> None:
    assert code(IDLE) is None


def test_each_reason_to_refuse_is_its_own_code_in_the_order_the_server_acts_on() -> None:
    assert code(state(draining=True, busy=2)) is LeaseRefusal.DRAINING  # drain first, whatever else
    assert code(IDLE, attempt_id="../etc") is LeaseRefusal.INVALID_LEASE
    assert code(state(hypervisor_up=False, hypervisor_reason="libvirtd down")) is LeaseRefusal.HYPERVISOR_DOWN
    assert code(state(busy=2)) is LeaseRefusal.NO_SLOT
    assert code(IDLE, runs_on="gpu") is LeaseRefusal.LABEL_MISMATCH
    assert code(IDLE, runs_on="lab") is None and code(IDLE, runs_on="vm") is None
    assert code(IDLE, image="win10") is LeaseRefusal.IMAGE_MISSING


def test_a_version_not_held_is_missing_unless_it_can_be_pulled_over_an_image_we_have() -> None:
    lease = make_lease("at_v")
    for version, held in ((3, True), (4, False)):
        lease.start_state = StartStateRef(kind="state", image="linux-tiny", start_state_id="ss_1", version=version)
        refusal = admission.lease_refusal(lease, IDLE)
        assert (refusal is None) is held
    assert refusal is not None and refusal.code is LeaseRefusal.VERSION_MISSING
    assert admission.lease_refusal(lease, state(can_pull=True)) is None
    assert admission.needs_pull(lease, can_pull=True) and not admission.needs_pull(lease, can_pull=False)
    lease.start_state = StartStateRef(kind="state", image="win10", start_state_id="ss_1", version=4)
    refusal = admission.lease_refusal(lease, state(can_pull=True))
    assert refusal is not None and refusal.code is LeaseRefusal.IMAGE_MISSING and "ss_1" in refusal.message


def test_the_disk_reserve_is_scaled_down_on_a_small_filesystem_and_says_so() -> None:
    assert admission.disk_refusal("/s", free_bytes=3000 * MIB, filesystem_bytes=100_000 * MIB,
                                  configured_bytes=2048 * MIB) is None
    low = admission.disk_refusal("/s", free_bytes=100 * MIB, filesystem_bytes=100_000 * MIB,
                                 configured_bytes=2048 * MIB)
    assert low is not None and low.code is LeaseRefusal.DISK_LOW and "only 100 MiB free under /s" in low.message
    assert "scaled" not in low.message
    # 10% of a 1.5 GiB filesystem: a reserve of 2 GiB there would refuse every lease for ever.
    assert admission.disk_refusal("/s", free_bytes=200 * MIB, filesystem_bytes=1536 * MIB,
                                  configured_bytes=2048 * MIB) is None
    small = admission.disk_refusal("/s", free_bytes=100 * MIB, filesystem_bytes=1536 * MIB,
                                   configured_bytes=2048 * MIB)
    assert small is not None and "scaled down to 10%" in small.message


def test_jobs_that_hold_no_slot_only_wait_for_a_drain() -> None:
    build = Job(job_id="jb_1", op="build", start_state_id="ss_1")
    save = Job(job_id="jb_2", op="save", start_state_id="ss_1", version=2)
    full = state(busy=2)
    assert admission.job_refusal(build, True, full) == "no free slot: 2 of 2 busy"
    assert admission.job_refusal(save, False, full) is None
    assert admission.job_refusal(save, False, state(draining=True)) == "draining: the runner is shutting down"


def test_slots_count_each_holder_once_and_a_pull_becomes_its_attempt() -> None:
    slots = Slots(2)
    slots.take("at_1", SlotHolder.PULL)
    slots.take("job:ss_1", SlotHolder.JOB)
    assert slots.busy == 2 and slots.free == 0
    slots.take("at_1", SlotHolder.ATTEMPT)  # the pull's slot moves to the attempt: still one
    assert slots.busy == 2 and slots.holds("at_1", SlotHolder.ATTEMPT) and not slots.holds("at_1", SlotHolder.PULL)
    assert slots.keys(SlotHolder.JOB) == ["job:ss_1"]
    assert slots.release("at_1") and not slots.release("at_1")
    assert slots.busy == 1
