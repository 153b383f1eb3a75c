"""An internal policy memo: what changes, why, exceptions, support and review. All names, places and figures
are invented by the facts function."""
from __future__ import annotations

import random

from benchmarks.prompts.documents import Genre, S
from benchmarks.prompts.text import MONTHS, people, surname, town

_POLICIES = (
    dict(area="hybrid working", rule1="staff may work from home on up to three days a week",
         rule2="every team must agree two shared office days and publish them on the team calendar",
         rule3="meetings with more than four people must offer a video link",
         reason="the pilot showed that fully flexible arrangements made it hard to plan shared work",
         exception="roles that depend on on-site equipment, such as laboratory and reception staff",
         tool="the room booking system"),
    dict(area="travel and expenses", rule1="all travel must be booked through the approved booking portal",
         rule2="rail is the default for journeys under four hours", rule3="receipts must be uploaded within "
         "thirty days of the trip", reason="last year's audit found inconsistent approvals and late claims",
         exception="urgent customer visits approved in writing by a director", tool="the expenses app"),
    dict(area="data retention", rule1="customer records are deleted six years after an account closes",
         rule2="personal files on shared drives are reviewed every twelve months",
         rule3="exports of customer data must be encrypted and logged",
         reason="we hold far more old data than we need, which increases our exposure if systems are breached",
         exception="records subject to a legal hold", tool="the records management dashboard"),
    dict(area="on-call support", rule1="no engineer is on call for more than one week in four",
         rule2="every alert that pages someone must link to a written runbook",
         rule3="anyone paged at night may start late the next morning",
         reason="a staff survey showed that on-call fatigue was the main cause of burnout in the engineering teams",
         exception="the two weeks around major product launches", tool="the paging schedule"),
    dict(area="software purchasing", rule1="new software subscriptions require approval from the IT team",
         rule2="free trials that need company data must go through a security review",
         rule3="each subscription has a named owner who confirms it is still needed every year",
         reason="we found more than two hundred paid tools, many of them duplicates or no longer used",
         exception="tools under a small annual cost that handle no company data", tool="the software catalogue"),
    dict(area="office energy use", rule1="heating is set to nineteen degrees during working hours",
         rule2="lights and screens switch off automatically after seven in the evening",
         rule3="meeting rooms left empty for fifteen minutes are released and powered down",
         reason="energy costs for our buildings have risen by more than half in two years",
         exception="server rooms and areas with specific health requirements", tool="the building management "
         "portal"),
    dict(area="parental leave", rule1="all parents, whatever their gender, receive sixteen weeks of fully paid "
         "leave", rule2="leave can be taken in up to three blocks during the child's first two years",
         rule3="returning parents may work reduced hours for their first month back without losing pay",
         reason="our previous policy treated parents differently and fell behind what comparable employers offer",
         exception="staff still in their probation period, who receive a shorter entitlement",
         tool="the HR self-service portal"),
    dict(area="generative AI tools", rule1="only the AI tools approved by the IT team may be used for company work",
         rule2="no customer data or confidential documents may be pasted into any external AI service",
         rule3="any text or code produced with AI help must be reviewed by the person who submits it",
         reason="staff already use these tools widely, and without rules we cannot protect our clients' "
         "information", exception="research projects approved by the data protection officer",
         tool="the approved tools list on the intranet"),
    dict(area="business travel safety", rule1="every trip abroad must be registered with the travel desk before "
         "booking", rule2="staff travelling to higher-risk regions complete a short briefing beforehand",
         rule3="travellers send a check-in message on arrival and before returning",
         reason="last year two colleagues were stranded during a strike and we struggled to locate them",
         exception="day trips to neighbouring countries for routine customer meetings",
         tool="the travel registration form"),
    dict(area="meetings", rule1="no internal meeting is scheduled for longer than forty-five minutes",
         rule2="every meeting invitation includes an agenda and the decision it is meant to reach",
         rule3="Wednesday afternoons are kept free of internal meetings",
         reason="our survey showed that people spend almost half their week in meetings, many without a clear "
         "purpose", exception="quarterly planning sessions and workshops with customers",
         tool="the shared calendar"),
)


def _memo_facts(rng: random.Random, topic: dict) -> dict:
    author, contact, pilot_lead = people(rng, 3)
    return dict(topic, org=f"{town(rng)} Group", author=author, author_s=surname(author),
                contact=contact, pilot_lead=pilot_lead, pilot_teams=rng.randint(3, 11),
                pilot_weeks=rng.randint(6, 20), start_month=rng.choice(MONTHS), sessions=rng.randint(3, 8),
                survey=rng.randint(52, 91), review_months=rng.choice((6, 9, 12)))


MEMO = Genre("internal policy memo", "Memo from {author}: new {area} policy at {org}", _POLICIES, _memo_facts, (
    S(("This memo explains the new policy on {area}, which takes effect on the first of {start_month}.",
       "From the first of {start_month}, a new policy on {area} will apply across {org}; this memo sets out what "
       "changes and why."),
      ("It replaces the guidance issued three years ago and applies to all permanent and temporary staff.",
       "The policy applies to everyone who works for us, including contractors, and replaces all earlier "
       "guidance."),
      "Please read it in full, even if you think the changes will not affect you."),
    S(("We are making these changes because {reason}.", "The main reason for the change is that {reason}."),
      ("Over the past year we have also received many questions and suggestions from staff, and the new policy "
       "tries to answer the most common ones.",
       "Staff have raised the topic repeatedly in surveys and team meetings, and we wanted one clear set of rules "
       "instead of local arrangements."),
      ("We tested the main ideas with {pilot_teams} teams over {pilot_weeks} weeks before finalising them.",
       "Before deciding, {pilot_lead} ran a {pilot_weeks}-week pilot with {pilot_teams} teams.")),
    S(("The first change is that {rule1}.", "The most visible change is that {rule1}."),
      ("In the pilot, {survey} percent of participants said this rule was clear and workable.",
       "{survey} percent of pilot participants rated this change as easy to follow."),
      ("Managers will be asked to check how the rule works in their teams after three months.",
       "Managers should raise any practical problems with it at the first quarterly review.")),
    S(("Second, {rule2}.", "The second change is that {rule2}."),
      ("This is intended to make expectations consistent between departments, which has been a frequent source "
       "of frustration.",
       "Until now practice has varied widely between departments, and this rule is meant to end that."),
      "Where this creates difficulties for a particular team, the manager should contact the policy owner."),
    S(("Third, {rule3}.", "Finally, {rule3}."),
      ("This may feel like extra administration at first, but it gives us the information we need to keep the "
       "policy fair.",
       "We recognise this adds a small step to your routine, and we have tried to keep it as light as possible."),
      ("Compliance will be checked through {tool}, so there is no need to keep separate records.",
       "You can do this through {tool}, which has been updated for the new rules.")),
    S(("Some things do not change.", "It is worth saying clearly what stays the same."),
      ("Your contract, your working hours and your existing leave arrangements are not affected by this policy.",
       "Nothing in this policy changes your terms of employment, your pay or your holiday entitlement."),
      ("Arrangements already agreed for health reasons or caring responsibilities remain in place and will be "
       "honoured.",
       "Individual arrangements agreed for health or family reasons continue as before, and you do not need to "
       "apply for them again."),
      ("If you are unsure whether an existing arrangement is affected, ask your manager before the start date "
       "rather than after it.",
       "Where you are unsure how the new rules interact with an existing agreement, please check with your "
       "manager in advance.")),
    S(("Responsibilities are shared.", "Everyone has a part to play in making the policy work."),
      ("Employees are responsible for following the rules and for raising problems when they see them.",
       "Each of us is expected to follow the rules and to speak up when they do not work."),
      ("Managers are responsible for explaining the policy to their teams, applying it consistently and recording "
       "decisions in {tool}.",
       "Managers must make sure their teams understand the policy, apply it fairly and keep {tool} up to date."),
      ("The policy owner is responsible for answering questions, keeping the guidance current and reporting to "
       "the leadership team twice a year.",
       "The policy owner will keep the guidance current and report to the leadership team every six months."),
      optional=True),
    S(("The only standing exception is for {exception}.",
       "One exception is built in: the rules do not apply in the same way to {exception}."),
      ("Any other exception must be agreed in writing by a head of department and reviewed after three months.",
       "Other requests for exceptions should go to your head of department, who will decide within ten working "
       "days."),
      "We will publish a summary of the exceptions granted each year, without naming individuals.",
      optional=True),
    S(("To help everyone adjust, we will run {sessions} short online briefings during the month before the policy "
       "takes effect.",
       "There will be {sessions} briefing sessions before the start date, each lasting about thirty minutes."),
      ("Recordings and a list of frequently asked questions will be posted on the intranet.",
       "A question-and-answer page is already available on the intranet and will be updated regularly."),
      ("Line managers will receive a short guide on handling common situations.",
       "Managers will also get a one-page guide covering the situations most likely to come up."),
      optional=True),
    S(("We will review the policy after {review_months} months, using data from {tool} and a short staff survey.",
       "A formal review is planned after {review_months} months, and we will share the results."),
      ("If something is not working, we would rather hear about it early than discover it at the review.",
       "Please tell us early if something does not work in practice; the review is not the only chance to change "
       "things."),
      ("Questions can be sent to {contact}, who is the policy owner.",
       "The policy owner is {contact}, and all questions should go to them in the first instance."),
      ("Thank you for your patience and for the many comments that shaped this policy. {author}",
       "Thank you to everyone who took part in the pilot. Kind regards, {author}")),
))
