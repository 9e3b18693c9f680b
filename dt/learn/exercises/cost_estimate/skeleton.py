# dt exercise: cost_estimate
# Fill in each answer (seconds for times; Python arithmetic is fine), then: dt judge cost_estimate.py

steps = None  # sequential message steps of the ring all-reduce on 8 ranks
bytes_per_rank = None  # bytes each rank sends for S = 1 GB
time_1GB = None  # seconds, S = 1 GB
time_1MB = None  # seconds, S = 1 MB
latency_bound_1MB = None  # True or False: at 1 MB, do the steps cost more than the bytes?
