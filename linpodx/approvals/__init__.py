"""Approval requests and answers: files under the state dir, no daemon."""
