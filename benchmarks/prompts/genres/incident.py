"""A blameless incident postmortem: impact, timeline, causes, lessons and actions. All names, places and
figures are invented by the facts function."""
from __future__ import annotations

import random

from benchmarks.prompts.documents import Genre, S
from benchmarks.prompts.text import MONTHS, WEEKDAYS, firm, people, surname

_CAUSES = (
    dict(cause="an expired TLS certificate on the internal load balancer",
         detect="health checks began failing for every service behind the load balancer",
         fix="renewed the certificate manually and restarted the affected proxies",
         lesson="certificate renewal had depended on a reminder sent to a single person",
         action="automate certificate renewal and alert thirty days before any certificate expires"),
    dict(cause="a configuration change that set the connection pool size to zero",
         detect="error rates on the checkout service rose from almost nothing to over forty percent",
         fix="rolled back the configuration change and restarted the application servers",
         lesson="the configuration system accepted a value that could never be valid",
         action="validate configuration changes against a schema and roll them out gradually"),
    dict(cause="a database failover that left the application connected to a read-only replica",
         detect="users began seeing errors whenever they tried to save changes",
         fix="pointed the application at the new primary database and cleared stale connections",
         lesson="the application cached the database address and never refreshed it after a failover",
         action="resolve the database address on every new connection and rehearse failovers monthly"),
    dict(cause="a memory leak introduced in the previous release of the search service",
         detect="search requests slowed down steadily until the servers ran out of memory and restarted in a loop",
         fix="rolled back to the earlier release and added temporary memory limits",
         lesson="the load tests used before release ran for only ten minutes, too short to expose the leak",
         action="run a four-hour soak test before every release of a core service"),
    dict(cause="a DNS change that removed a record still used by the payment provider's callbacks",
         detect="payments were taken but orders stayed marked as unpaid",
         fix="restored the DNS record and replayed the missed payment notifications",
         lesson="nobody had a complete list of the external systems that depended on our DNS records",
         action="keep an inventory of external dependencies and require two reviewers for DNS changes"),
    dict(cause="a full disk on the message queue servers after a logging change",
         detect="messages between services stopped flowing and background jobs piled up",
         fix="freed disk space, restored the previous logging level and restarted the queue cluster",
         lesson="disk usage alerts existed but were routed to a channel nobody watched at weekends",
         action="route storage alerts to the paging system and cap the size of debug logs"),
    dict(cause="a scheduled job that deleted cache entries in bulk and overloaded the database",
         detect="page load times rose from under a second to more than thirty seconds",
         fix="paused the job, let the cache warm up again and throttled database connections",
         lesson="the job had only ever been tested against a small copy of production data",
         action="run bulk maintenance jobs in small batches and test them on production-sized data"),
    dict(cause="an expired API key for our third-party email provider",
         detect="password reset and order confirmation emails stopped being delivered",
         fix="issued a new key, deployed it and resent the queued emails",
         lesson="the key's expiry date was not recorded anywhere we monitor",
         action="track the expiry of every third-party credential and alert two weeks in advance"),
    dict(cause="a network change that sent traffic for one data centre through a congested link",
         detect="requests from one region timed out while other regions were unaffected",
         fix="reverted the routing change and moved traffic back to the usual links",
         lesson="network changes were not tested against realistic traffic volumes before rollout",
         action="require a staged rollout and automatic rollback for every routing change"),
    dict(cause="a mobile app update that sent far more requests than the previous version",
         detect="traffic to the API tripled within an hour of the app update being released",
         fix="switched off the new feature remotely and added rate limits to the affected endpoint",
         lesson="the new app version retried failed requests immediately and without limit",
         action="add exponential backoff to the app's retries and load-test every app release against the API"),
)


def _incident_facts(rng: random.Random, topic: dict) -> dict:
    commander, engineer, manager = people(rng, 3)
    start_h = rng.randint(0, 22)
    duration = rng.randint(38, 290)
    return dict(topic, service=rng.choice(("order management", "customer portal", "booking",
                "billing", "mobile app backend", "partner API")), company=firm(rng), commander=commander,
                commander_s=surname(commander), engineer=engineer, engineer_s=surname(engineer), manager=manager,
                weekday=rng.choice(WEEKDAYS), month=rng.choice(MONTHS), day=rng.randint(2, 27),
                start=f"{start_h:02d}:{rng.randint(0, 59):02d}", duration=duration,
                detect_min=rng.randint(3, 25), users=f"{rng.randint(2, 95) * 1000:,}",
                failed=f"{rng.randint(300, 48000):,}", tickets=rng.randint(40, 900), actions=rng.randint(5, 11))


INCIDENT = Genre("incident postmortem", "Postmortem: {service} outage on {day} {month}", _CAUSES, _incident_facts, (
    S(("On {weekday} {day} {month}, the {service} service at {company} was unavailable or badly degraded for "
       "{duration} minutes, starting at {start} UTC.",
       "Starting at {start} UTC on {day} {month}, customers of {company} could not reliably use the {service} "
       "service for {duration} minutes."),
      ("The direct cause was {cause}.", "The outage was caused by {cause}."),
      ("This document describes what happened, how we responded and what we will change.",
       "This postmortem follows our blameless format: it focuses on systems and processes, not on "
       "individuals.")),
    S(("About {users} users were affected, and roughly {failed} requests failed during the incident.",
       "We estimate that {users} users saw errors and that {failed} requests failed outright."),
      ("Our support team received {tickets} tickets, and the status page was updated five times.",
       "Support handled {tickets} tickets related to the outage."),
      ("No data was lost, although some users had to repeat actions that failed.",
       "We have found no evidence of data loss or corruption, but some users had to retry their work.")),
    S(("The first sign of trouble was that {detect}.", "The problem first became visible when {detect}."),
      ("Automated alerts fired after {detect_min} minutes, and {engineer}, the on-call engineer, acknowledged the "
       "page almost immediately.",
       "Our monitoring raised an alert {detect_min} minutes after the problem began, and the on-call engineer, "
       "{engineer}, started investigating within two minutes."),
      ("Because several symptoms appeared at once, it took time to tell cause from effect.",
       "The initial symptoms pointed in several directions at once, which slowed the diagnosis.")),
    S(("The timeline below summarises the key moments; all times are UTC.",
       "The main events, in order, were as follows (times in UTC)."),
      ("At {start}, the problem began, although nobody noticed it at first.",
       "The first failures occurred at {start} and were initially invisible to our dashboards."),
      ("{detect_min} minutes later the first alert fired and the on-call engineer was paged.",
       "After {detect_min} minutes, an automated alert paged the on-call engineer."),
      ("Within a quarter of an hour an incident channel had been opened and the first public status update "
       "published.",
       "An incident channel was opened soon afterwards, and the status page was updated to say we were "
       "investigating."),
      ("The cause was identified roughly halfway through the outage, and the remaining time was spent on the fix "
       "and on confirming that the service had fully recovered.",
       "About half of the {duration} minutes went on finding the cause; the rest went on fixing it and verifying "
       "the recovery.")),
    S(("Communication with customers followed our standard process.",
       "Customer communication deserves its own section, because it is where we most want to improve."),
      ("The support team posted a banner in the product, replied to tickets with a shared template and "
       "escalated the largest customers to their account managers.",
       "Support replied to every ticket, and account managers phoned our largest customers during the incident."),
      ("Several customers told us the updates were too vague to help them decide whether to wait or to use a "
       "workaround.",
       "Feedback from customers was that our updates said that something was wrong but not what they should "
       "do."),
      ("Future updates will include an estimated time of the next update and, where possible, practical advice.",
       "We will add clear guidance and the time of the next update to every status message."),
      optional=True),
    S(("{engineer_s} declared an incident and {commander} took the role of incident commander.",
       "An incident was declared, with {commander} acting as incident commander and {engineer_s} leading the "
       "technical investigation."),
      ("The team first suspected a problem with a recent deployment, but rolling it back made no difference.",
       "An early theory was that a deployment earlier that day was responsible, but reverting it changed "
       "nothing."),
      ("Attention then turned to the infrastructure, where the real cause was found.",
       "Only when the team examined the underlying infrastructure did the cause become clear."),
      ("Once the cause was understood, the team {fix}.", "With the cause identified, the engineers {fix}."),
      ("Service recovered gradually over the following minutes, and the incident was closed after a period of "
       "monitoring.",
       "Error rates returned to normal shortly afterwards, and the incident was resolved after an hour of "
       "observation.")),
    S(("Looking deeper, the underlying problem is that {lesson}.",
       "The root cause analysis found that {lesson}."),
      ("This was not a new risk: a similar near miss was noted last year, but the follow-up was never completed.",
       "A comparable risk had been noted in an earlier review, but the planned fix was deprioritised."),
      ("We also found that our runbook for this situation was out of date and referred to tools we no longer "
       "use.",
       "The relevant runbook was incomplete, which cost the responders valuable time.")),
    S("Several things went well.",
      ("The on-call engineer responded quickly, the incident channel stayed focused, and customer communication "
       "was regular and honest.",
       "Responders worked calmly and communicated clearly, and the status page was updated regularly."),
      ("Colleagues from other teams offered help without being asked, and handovers between time zones were "
       "smooth.",
       "Engineers from two other teams joined to help, and nobody had to be woken up unnecessarily."),
      optional=True),
    S("Some things went badly.",
      ("Alerts described symptoms rather than causes, dashboards for the affected component were hard to find, "
       "and the first status page update took too long.",
       "It took too long to post the first public update, and the alert messages did not point to the likely "
       "cause."),
      ("We were also lucky: had the incident started during our peak hours, the impact would have been several "
       "times larger.",
       "Luck played a part too, since the outage began outside our busiest period.")),
    S(("We have agreed {actions} follow-up actions, each with an owner and a due date.",
       "The review produced {actions} actions, all tracked in our issue tracker with named owners."),
      ("The most important is to {action}.", "The highest-priority action is to {action}."),
      ("We will also update the runbook, improve the alert text and add the affected component to our weekly "
       "reliability review.",
       "Other actions include rewriting the runbook, improving alert messages and adding a dashboard for the "
       "affected component."),
      ("{manager}, the engineering manager for the service, will review progress on these actions in four weeks.",
       "Progress will be reviewed in four weeks by {manager}, who manages the team that owns the service.")),
    S(("We apologise to everyone affected by this outage.", "We are sorry for the disruption this caused."),
      ("Reliability is the most important feature of {service}, and we did not meet the standard our customers "
       "expect.",
       "Our customers rely on {service} for their daily work, and we fell short of what they should be able to "
       "expect."),
      optional=True),
))
