"""Minutes of a club or association meeting: reports, two agenda items, actions. All names, places and
figures are invented by the facts function."""
from __future__ import annotations

import random

from benchmarks.prompts.documents import Genre, S
from benchmarks.prompts.text import MONTHS, WEEKDAYS, people, surname, town

_CLUBS = (
    dict(org="Community Garden Association", a="the waiting list for allotment plots",
         a_detail="forty-two households are waiting and the average wait has passed two years",
         a_decision="split six of the largest plots in half and offer them to the longest-waiting households",
         b="repairs to the shared tool shed", b_detail="the roof leaks and two of the padlocks no longer close",
         b_decision="buy materials and hold a repair day on the first Saturday of next month",
         event="the autumn harvest fair"),
    dict(org="Parents' Council of the primary school", a="the route children walk to school",
         a_detail="parents have reported cars speeding past the side gate during drop-off",
         a_decision="ask the town for a crossing patrol and a temporary speed limit sign",
         b="the school library appeal", b_detail="many of the picture books are worn out and the reading corner "
         "has no comfortable seating", b_decision="run a sponsored read and a second-hand book sale",
         event="the summer sports afternoon"),
    dict(org="Residents' Committee of the riverside apartment block", a="the broken entrance door",
         a_detail="the main door has failed to lock for three weeks and parcels have gone missing",
         a_decision="press the managing agent for a repair date in writing and log every incident",
         b="bicycle storage in the basement", b_detail="the rack holds twenty bikes but more than fifty are stored "
         "there", b_decision="tag every bicycle and remove those left unclaimed for a month",
         event="the spring clean-up of the courtyard"),
    dict(org="Volunteer Fire Brigade Support Committee", a="recruitment of new volunteers",
         a_detail="only three people applied this year and several long-serving members are retiring",
         a_decision="hold an open evening at the station and visit the two secondary schools",
         b="fundraising for a new rescue boat", b_detail="the current boat is twenty-six years old and failed its "
         "last inspection", b_decision="apply to two charitable trusts and organise a sponsored swim",
         event="the annual open day at the fire station"),
    dict(org="Hill Walking Club Committee", a="safety on winter walks",
         a_detail="two walks last season finished after dark and one member was injured on an icy path",
         a_decision="require a named back marker and a fixed turn-around time on every winter walk",
         b="transport to the start of longer walks", b_detail="the club minibus is often full and car sharing has "
         "been hard to arrange", b_decision="set up a shared sign-up sheet for lifts a week before each walk",
         event="the club's midsummer ridge walk"),
    dict(org="Steering Group of the open-source mapping project", a="the backlog of unreviewed contributions",
         a_detail="more than three hundred changes are waiting and some contributors have stopped submitting",
         a_decision="recruit six more reviewers and add an automatic first check for common errors",
         b="the hosting budget", b_detail="traffic has grown faster than expected and the server bill has doubled",
         b_decision="ask the two largest users for sponsorship and cache map tiles more aggressively",
         event="the project's first in-person contributor weekend"),
    dict(org="Board of the Community Choir", a="the choice of music for the winter concert",
         a_detail="several members find the proposed programme too difficult to learn in eight weeks",
         a_decision="keep two of the demanding pieces and replace the third with a well-known carol arrangement",
         b="the cost of hiring the church hall", b_detail="the hall will raise its hourly rate by a quarter from "
         "January", b_decision="ask the school whether its music room could be used for ordinary rehearsals",
         event="the winter concert"),
    dict(org="Friends of the Town Park", a="damage to the flower beds near the playground",
         a_detail="beds planted in spring have been trampled several times and some plants have been stolen",
         a_decision="put up a low fence and ask the council for a sign explaining the project",
         b="the proposal for a community orchard", b_detail="the council has offered a strip of land along the "
         "eastern path", b_decision="accept the offer and apply for a grant to buy twenty fruit trees",
         event="the autumn planting day"),
    dict(org="Repair Café Organising Group", a="the growing queue at monthly sessions",
         a_detail="visitors waited up to two hours last month and some went home without being seen",
         a_decision="introduce bookings for larger items and recruit two more volunteer fixers",
         b="safety checks on electrical repairs", b_detail="the insurer now requires every repaired appliance to "
         "be tested before it is returned", b_decision="buy a portable appliance tester and train three "
         "volunteers to use it", event="the Repair Café's fifth birthday session"),
    dict(org="Millside Estate Tenants' Association", a="damp and mould in the ground-floor flats",
         a_detail="eleven households have reported mould, and two families have children with asthma",
         a_decision="collect evidence from every affected flat and request an urgent meeting with the landlord",
         b="the state of the children's play area", b_detail="the swings were removed a year ago and have not "
         "been replaced", b_decision="write to the housing provider and start a petition among residents",
         event="the estate's summer fun day"),
)


def _minutes_facts(rng: random.Random, topic: dict) -> dict:
    chair, secretary, treasurer, member, guest = people(rng, 5)
    return dict(topic, town=town(rng), chair=chair, chair_s=surname(chair), secretary=secretary,
                treasurer=treasurer, treasurer_s=surname(treasurer), member=member, member_s=surname(member),
                guest=guest, present=rng.randint(9, 31), apologies=rng.randint(1, 6),
                balance=f"{rng.randint(1200, 18500):,}", spent=f"{rng.randint(150, 2400):,}",
                month=rng.choice(MONTHS), day=rng.randint(2, 27), weekday=rng.choice(WEEKDAYS),
                time=rng.choice(("7 pm", "7.30 pm", "6.30 pm", "8 pm")), volunteers=rng.randint(4, 15),
                new_members=rng.randint(5, 24))


MINUTES = Genre("set of meeting minutes", "Minutes of the {org} meeting, {town}, {day} {month}", _CLUBS,
                _minutes_facts, (
    S(("The meeting opened at {time} with {chair} in the chair and {present} members present.",
       "{chair} chaired the meeting, which began at {time}; {present} members attended."),
      ("Apologies were received from {apologies} members who could not attend.",
       "{apologies} members had sent apologies in advance."),
      ("The chair welcomed {guest}, who joined the meeting as a guest for the first item.",
       "{guest} attended as a guest at the chair's invitation.")),
    S(("The minutes of the previous meeting were approved without changes.",
       "The minutes of the last meeting were accepted as an accurate record."),
      ("Under matters arising, the secretary, {secretary}, reported that the letters agreed last time had been "
       "sent and that one reply had been received.",
       "{secretary}, as secretary, confirmed that all actions from the previous meeting had been completed except "
       "one, which is carried forward."),
      "Members agreed that the outstanding action would be reviewed again at the next meeting."),
    S(("Under correspondence, the secretary read out a letter from the town council about changes to the rules "
       "for community groups using public buildings.",
       "The secretary summarised the correspondence received, the most important being a letter from the town "
       "council about new conditions for groups that use public buildings."),
      ("The letter asks every group to name a safety officer and to confirm its insurance cover before the end "
       "of {month}.",
       "Groups are now asked to confirm their insurance and to name a person responsible for safety by the end "
       "of {month}."),
      ("{guest} offered to act as safety officer until the annual general meeting, and the offer was accepted "
       "with thanks.",
       "After a short discussion, {guest} agreed to take on the safety role for the rest of the year."),
      ("Other letters included a request for a donation to the local hospice and an invitation to the town's "
       "volunteer fair.",
       "The remaining letters, an invitation to the volunteer fair and two requests for donations, were noted.")),
    S(("The membership secretary reported that {new_members} people have joined since the start of the year, "
       "and that most of them had heard about the group from friends.",
       "Membership has grown over the year, and most new members said they had joined after a personal "
       "recommendation."),
      ("Members discussed how to make newcomers feel welcome, since several had stopped coming after one or two "
       "meetings.",
       "There was concern that some new members drift away after their first few visits."),
      ("It was agreed to pair each new member with an experienced one for their first three months and to "
       "produce a short welcome leaflet.",
       "The meeting agreed to try a buddy system and to prepare a one-page welcome note explaining how the group "
       "works."),
      optional=True),
    S(("{treasurer} presented the treasurer's report, showing a balance of {balance} after spending of {spent} "
       "since the last meeting.",
       "In the treasurer's report, {treasurer} gave the current balance as {balance}; spending since the last "
       "meeting came to {spent}."),
      ("Most of the spending was on routine costs such as insurance, printing and room hire.",
       "The largest costs were insurance and room hire, with smaller amounts for printing and postage."),
      ("{treasurer_s} warned that income from subscriptions was lower than at the same point last year and asked "
       "members to remind others to renew.",
       "{treasurer_s} noted that several members had not yet renewed their subscriptions and that reminders would "
       "go out this month."),
      "The report was accepted."),
    S(("The main item on the agenda was {a}.", "Discussion then turned to {a}, the main item of the evening."),
      ("{member} explained that {a_detail}.", "Members heard from {member} that {a_detail}."),
      ("Several members felt the problem had been left too long, while others urged caution about acting before "
       "the full costs were known.",
       "Opinions differed: some wanted immediate action, while others preferred to gather more information first."),
      ("After a long discussion the meeting agreed to {a_decision}.",
       "It was finally agreed to {a_decision}."),
      ("{member_s} will report back on progress at the next meeting.",
       "{member_s} agreed to lead this work and to report back next time.")),
    S(("The second item was {b}.", "The committee then considered {b}."),
      ("The chair reported that {b_detail}.", "{chair_s} explained that {b_detail}."),
      ("Members discussed several options, including doing nothing until next year.",
       "A number of options were discussed, ranging from a temporary fix to a complete replacement."),
      ("The meeting agreed to {b_decision}.", "It was agreed, with two members abstaining, to {b_decision}.")),
    S(("Plans for {event} were reviewed.", "The meeting looked ahead to {event}."),
      ("So far {volunteers} volunteers have offered to help, but more are needed for setting up and clearing away.",
       "{volunteers} people have volunteered so far; more help is needed on the day itself."),
      ("The secretary will circulate a sign-up sheet by email.",
       "A sign-up sheet will be circulated by the secretary."),
      ("Members were reminded that the event depends on good weather and that a decision on whether to go ahead "
       "will be taken two days before.",
       "If the forecast is poor, the chair will decide two days beforehand whether the event goes ahead."),
      optional=True),
    S("Under any other business, a member asked whether meetings could be held online for those who cannot "
      "travel.",
      ("The chair agreed to look into a hybrid format and to test it at the next meeting.",
       "It was agreed to try a hybrid meeting next time and to review how well it works."),
      ("Another member thanked the committee for its work over the past year, which was warmly received.",
       "A vote of thanks was recorded for the outgoing newsletter editor."),
      optional=True),
    S(("Actions agreed at this meeting: {member_s} to lead on {a}; the secretary to circulate the sign-up sheet; "
       "{treasurer_s} to send subscription reminders.",
       "Summary of actions: {member_s} will take forward the work on {a}, {treasurer_s} will chase "
       "subscriptions, and the secretary will handle correspondence."),
      ("The next meeting will be held on the second {weekday} of next month at the usual time.",
       "The date of the next meeting was set for the second {weekday} of next month."),
      ("The meeting closed at a quarter to ten.", "There being no further business, the chair closed the "
       "meeting.")),
))
