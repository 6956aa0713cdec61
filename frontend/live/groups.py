"""Channel-layer groups of the live endpoint, and who is put in which.

A connection is put in groups by the server from its principal, never by the client:
- an operator's users: `live.operator.<operator pk>` (every verdict and job of the fleet);
- a customer's users: `live.customer.<customer pk>` (verdicts and states of its own jobs);
- a client narrowing to one job or incident (after the server checked the principal may see
  it): `live.job.<operator pk>.<digest of the job id>` or `live.incident.<incident pk>`.
Chart points go to job groups only: only an open job page draws them.

Group names may hold only ASCII letters, digits, '-', '_' and '.', under 100 characters, and a
scheduler's job id may hold anything: the job group carries a digest of it, computed from the
id alone so that a publisher needs no query to name the group.
"""

from __future__ import annotations

import hashlib

from tenants.access import Principal


def operator_group(operator_id: int) -> str:
    return f"live.operator.{operator_id}"


def customer_group(customer_id: int) -> str:
    return f"live.customer.{customer_id}"


def job_group(operator_id: int, job_id: str) -> str:
    digest = hashlib.sha256(job_id.encode()).hexdigest()[:32]
    return f"live.job.{operator_id}.{digest}"


def incident_group(incident_pk: int) -> str:
    return f"live.incident.{incident_pk}"


def default_groups(principal: Principal) -> set[str]:
    """What a connection hears before it narrows: the fleet for operator roles, the
    customer's own jobs for customer roles (nothing for a customer principal without one)."""
    if principal.is_customer:
        return {customer_group(principal.customer_id)} if principal.customer_id else set()
    return {operator_group(principal.operator_id)}


def verdict_groups(
    operator_id: int, incident_pk: int, job_id: str | None, customer_id: int | None
) -> set[str]:
    """Who hears a verdict: the operator, the job's customer, the job's and the incident's
    narrowed listeners. A fleet-health verdict (no job) reaches the operator only."""
    groups = {operator_group(operator_id), incident_group(incident_pk)}
    if job_id is not None:
        groups.add(job_group(operator_id, job_id))
        if customer_id is not None:
            groups.add(customer_group(customer_id))
    return groups


def job_state_groups(operator_id: int, job_id: str, customer_id: int | None) -> set[str]:
    groups = {operator_group(operator_id), job_group(operator_id, job_id)}
    if customer_id is not None:
        groups.add(customer_group(customer_id))
    return groups
