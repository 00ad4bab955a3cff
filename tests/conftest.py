"""Shared pytest setup for the cross-service tests."""
