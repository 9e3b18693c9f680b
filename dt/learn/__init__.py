"""The learner's side: practise what the rest of dt shows.

    dt exercises list                 the exercises, each with a statement, a cost to reach, hints
    dt exercises start ring_all_reduce   copy a skeleton here; write the collective from send/recv
    dt judge ring_all_reduce.py       run it on the shapes that break naive code, against torch
    dt quiz                           the chapter's self-test, each answer checked or explained

- judge/      runs a learner's collective in its own processes and says, case by
              case, whether it is right (against torch's own collective), whether
              it deadlocks (and who waits on whom), whether it calls a collective
              it should have written, and what it sends against dt.cost's figure
- exercises/  one folder per exercise: statement and hints, skeleton, reference solution
- quiz.py     the self-test

Nothing here is imported by the rest of dt: it sits on top, next to the tools.
"""
