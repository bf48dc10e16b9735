"""The router tier: stateless ROUTER/DEALER front ends between clients and storage nodes."""
