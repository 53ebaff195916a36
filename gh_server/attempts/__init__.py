"""An attempt's life on the server, one job per module (imports go down this list):

    scheduler   the loop: leases, housekeeping, run completion at a steady beat (a loop: app.py builds it)
    lease       queued attempts -> leases for this process's runners (frozen cases -> `Lease` messages)
    intake      a runner's result becomes the outcome: the rubric test, the judge decision, the verdict merge
    completion  a run with nothing unfinished becomes `completed`; progress and pass rate
    states      the attempt state machine in SQL: one transition table, every status-guarded row change
    matching    pure: which runner takes an attempt, and the refusal backoff by `LeaseRefusal` code
"""
