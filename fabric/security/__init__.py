"""Authentication (CurveZMQ keys of a deployment) and authorization (ACLs per principal)."""
