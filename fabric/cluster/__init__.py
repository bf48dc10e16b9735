"""Cluster logic: the metadata store interface (etcd), the controller, replication state
machines and placement. Pure where it can be; the sockets live in the node and the transports."""
