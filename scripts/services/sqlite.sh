# sqlite: no server (SQLite is a file); the fault-check configurations of the SQLite backend.
#   sqlite                       a database file in the check's output folder: pauses, crashes
#                                and starved renewals (no server to restart or cut off)
#   sqlite_clock                 the same with its leases' clock, the processes' own, stepping:
#                                the checker and its workers run under libfaketime on the
#                                clock file sqlite-clock.rc of the output folder

# shellcheck shell=bash

add_check 10 sqlite group=sqlite url="sqlite://{out}/check.db" faults=pause,crash,starve
add_check 75 sqlite_clock group=sqlite-clock url="sqlite://{out}/check-clock.db" faults=clock \
  clock="{out}/sqlite-clock.rc" runner=host-clock
