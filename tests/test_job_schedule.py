"""The order ``submit.analyse`` starts the jobs in (``spark_jobs.jobs.SCHEDULE``)."""

from spark_jobs.jobs import JOBS, SCHEDULE, parse_job_list, scheduled


def test_every_job_has_one_place_and_a_subset_keeps_only_its_jobs() -> None:
    assert sorted(SCHEDULE) == sorted(JOBS)
    assert scheduled(JOBS) == list(SCHEDULE)
    subset = parse_job_list("timelines,delivery,error_reaction")
    assert scheduled(subset) == ["error_reaction", "delivery", "timelines"]


def test_the_job_that_computes_the_shared_batch_fates_starts_before_the_one_that_reuses_them() -> None:
    # error_reaction computes delivery.shared_fates; delivery, started after it, reuses them
    # instead of waiting on the lock while a core idles
    order = scheduled(JOBS)
    assert order.index("error_reaction") < order.index("delivery")
    assert order[0] == "error_reaction"
