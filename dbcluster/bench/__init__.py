"""``dbcluster bench``: coordination cost, latency, failover time and the ceiling, measured on
your database. Every figure that depends on the machine is printed next to a baseline measured in
the same run."""
