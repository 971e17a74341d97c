"""Incident lab: real Kafka brokers and real clients on loopback."""
