"""The speedup models a job's curve is drawn from (malleable_sim.workload.SpeedupModel) and the
efficiency at the requested size every run reports."""
import random

import pytest

from malleable_sim import (Amdahl, Downey, SimJob, SpeedupModel, WorkloadModel,
                           efficiency_at_request, generate)
from malleable_sim.workload import EFFICIENCY_AT_REQUEST, draw_speedup


@pytest.mark.parametrize("size", [2, 8, 64, 1024])
def test_calibrated_curves_run_the_request_at_a_plausible_efficiency(size):
    rng = random.Random(size)
    for _ in range(200):
        curve = draw_speedup(SpeedupModel.CALIBRATED, size, rng, WorkloadModel())
        efficiency = curve.rate(size) / size
        assert EFFICIENCY_AT_REQUEST[0] - 1e-9 <= efficiency <= EFFICIENCY_AT_REQUEST[1] + 1e-9
        # More cores still help (no communication term), with less efficiency each.
        assert curve.rate(2 * size) > curve.rate(size)
        assert curve.rate(2 * size) / (2 * size) < efficiency


def test_a_one_core_request_is_calibrated_at_two():
    curve = draw_speedup(SpeedupModel.CALIBRATED, 1, random.Random(3), WorkloadModel())
    assert curve.rate(1) == 1.0 and 0.5 <= curve.rate(2) / 2 <= 0.9


def test_downey_takes_the_request_as_its_average_parallelism():
    curve = draw_speedup(SpeedupModel.DOWNEY, 16, random.Random(1), WorkloadModel())
    assert isinstance(curve, Downey) and curve.average_parallelism == 16.0
    assert 0.0 <= curve.sigma <= 2.0


def test_round2_draws_as_the_second_round_did():
    rng_a, rng_b = random.Random(7), random.Random(7)
    model = WorkloadModel()
    curve = draw_speedup(SpeedupModel.ROUND2, 256, rng_a, model)
    assert curve == Amdahl(rng_b.uniform(*model.serial_fraction), rng_b.uniform(*model.comm))
    # At its request a 256-core job runs at a few percent efficiency or a little more.
    assert curve.rate(256) / 256 < 0.5


def test_efficiency_at_request_weights_jobs_by_their_core_seconds():
    linear, half = Amdahl(0.0, 0.0), Amdahl(1.0 / 3.0, 0.0)     # at 4 cores: 1.0 and 0.5
    jobs = [SimJob(1, 0.0, 4, 100.0, linear), SimJob(2, 0.0, 4, 300.0, half)]
    assert half.rate(4) / 4 == pytest.approx(0.5)
    assert efficiency_at_request(jobs) == pytest.approx((400 * 1.0 + 1200 * 0.5) / 1600)
    assert efficiency_at_request([]) != efficiency_at_request([])     # nan


def test_the_generated_workload_is_calibrated_by_default():
    jobs = generate(400, 8, 16, 0.5, seed=2)
    assert 0.5 <= efficiency_at_request(jobs) <= 0.9
    old = generate(400, 8, 16, 0.5, seed=2, speedup=SpeedupModel.ROUND2)
    assert efficiency_at_request(old) < efficiency_at_request(jobs)
