"""The job control of the control plane: the shared job table, the job state machine and the
parts each handed the table and their peers (catalog, queries, journal, callbacks, results,
reports, events).  Runs in the control plane process."""
