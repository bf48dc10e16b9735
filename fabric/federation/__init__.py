"""Several clusters on one etcd: the federation directory, the planner and the elected manager."""
