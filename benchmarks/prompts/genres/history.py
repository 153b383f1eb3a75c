"""A local-history essay: a town industry from founding through decline to revival. All names, places and
figures are invented by the facts function."""
from __future__ import annotations

import random

from benchmarks.prompts.documents import Genre, S
from benchmarks.prompts.text import people, surname, town

_HISTORIES = (
    dict(thing="paper mill", product="writing paper and later cardboard packaging",
         decline="cheaper imports and the loss of its largest customer", revival="a museum and artists' studios"),
    dict(thing="ferry service", product="passenger crossings and livestock transport",
         decline="the opening of a road bridge further up the estuary", revival="summer heritage crossings run by "
         "volunteers"),
    dict(thing="glassworks", product="bottles, lamp chimneys and later laboratory glass",
         decline="automation in larger factories and rising fuel costs", revival="a small studio that trains "
         "glassblowers"),
    dict(thing="railway workshop", product="repairs to locomotives and carriages for the whole region",
         decline="the switch to diesel trains serviced in a central depot", revival="a business park that "
         "keeps the original engine shed"),
    dict(thing="wool market", product="fleeces from the surrounding hill farms",
         decline="falling wool prices and the rise of synthetic fibres", revival="a weekly craft and food market"),
    dict(thing="brass band", product="concerts, parades and competition performances",
         decline="the closure of the colliery that had paid for its instruments", revival="a youth band with "
         "more than forty young players"),
    dict(thing="shipyard", product="fishing boats and, later, small coastal cargo ships",
         decline="competition from larger yards abroad and the collapse of the local fishing fleet",
         revival="a boatbuilding school and a maritime museum"),
    dict(thing="pottery", product="everyday stoneware jugs, bowls and drainpipes",
         decline="cheap mass-produced tableware and the exhaustion of the local clay pit",
         revival="a cluster of ceramic studios and a popular summer pottery festival"),
    dict(thing="tannery", product="leather for boots, saddles and bookbinding",
         decline="stricter pollution rules and imports of cheaper leather",
         revival="a riverside park laid out on the cleaned-up site"),
    dict(thing="cotton mill", product="cotton thread and heavy canvas",
         decline="foreign competition and the end of government contracts for canvas",
         revival="flats, a library and a small textile museum in the restored mill building"),
)


def _history_facts(rng: random.Random, topic: dict) -> dict:
    founder, heir, manager, historian = people(rng, 4)
    founded = rng.randint(1795, 1885)
    return dict(topic, town=town(rng), founder=founder, founder_s=surname(founder), heir=heir,
                manager=manager, historian=historian, founded=founded, peak_year=founded + rng.randint(40, 70),
                closed=rng.randint(1962, 1994), revived=rng.randint(2001, 2019), peak_workers=rng.randint(180, 900),
                first_workers=rng.randint(6, 30), river=rng.choice(("Wenn", "Lowe", "Arrow", "Tiss", "Brede")))


HISTORY = Genre("local history essay", "A short history of the {town} {thing}", _HISTORIES, _history_facts, (
    S(("Few people who walk along the {river} in {town} today realise how much of the town's history is tied to "
       "its old {thing}.",
       "For more than a century the {thing} was the heart of {town}, and traces of it are still visible to anyone "
       "who knows where to look."),
      ("Its story is one of bold beginnings, long prosperity, painful decline and an unexpected second life.",
       "The story of the {thing} follows a pattern familiar from many small towns: a confident start, decades of "
       "success, a slow decline and, eventually, a kind of renewal.")),
    S(("The {thing} was founded in {founded} by {founder}, the son of a local carpenter with more ambition than "
       "capital.",
       "It began in {founded}, when {founder} borrowed money from relatives to set up the {thing} beside the "
       "{river}."),
      ("In its first year it employed just {first_workers} people and relied heavily on the river for power and "
       "transport.",
       "At first there were only {first_workers} workers, and the business depended on the river both for power "
       "and for carrying goods to market."),
      ("Records from the period show that {founder_s} often worked alongside the employees and kept the accounts "
       "by hand.",
       "{founder_s} kept meticulous notebooks, several of which survive in the county archive.")),
    S(("Its main business was {product}.", "Over the years the {thing} became known for {product}."),
      ("Demand grew steadily as the railway reached the valley, opening markets that had been out of reach.",
       "The arrival of the railway transformed its prospects, making it possible to reach customers in the large "
       "cities."),
      ("By the time {founder_s} died, the {thing} had passed to {heir}, who modernised its equipment and "
       "doubled its size.",
       "After the founder's death it was run by {heir}, who invested heavily in new equipment."),
      "Much of the housing on the streets nearest the river was built for its workers in this period."),
    S(("Working life at the {thing} was demanding.", "Conditions were hard by modern standards."),
      ("Shifts lasted ten or twelve hours, and children as young as twelve were employed until the law changed.",
       "A normal shift lasted ten hours or more, and in the early decades boys of twelve worked alongside their "
       "fathers."),
      ("Accidents were common, and the first sick club, funded by a penny a week from each worker's wages, was "
       "set up after a serious fire.",
       "After a fire injured several workers, the employees founded a sick club into which each paid a small "
       "weekly sum."),
      ("Yet many former workers later remembered the {thing} with affection, describing a place where skills "
       "were passed from one generation to the next.",
       "Even so, memories collected later are often warm, recalling the pride people took in their skills and "
       "the friendships formed on the job.")),
    S(("Both world wars left their mark.", "The two world wars brought sudden changes."),
      ("Many of the younger men left to serve, and women took over work that had been closed to them, often "
       "doing it as well or better.",
       "With many men away in the forces, women took on jobs they had never been allowed to do, and production "
       "barely fell."),
      ("A memorial listing the employees who did not return still stands near the old gate.",
       "The names of the workers who did not come back are carved on a plaque that was rescued when the site "
       "closed."),
      optional=True),
    S(("The {thing} reached its peak around {peak_year}, when it supported some {peak_workers} jobs.",
       "At its height, around {peak_year}, about {peak_workers} people depended on it for their living."),
      ("It sponsored a school, a reading room and a football team, and its annual summer outing was the biggest "
       "event in the town's calendar.",
       "It paid for a reading room and a sports ground, and its summer outing became a fixture of local life."),
      ("Older residents still describe the sound of its bell marking the start and end of each shift.",
       "Photographs from this time show crowded streets at the change of shift and a busy quay by the river."),
      optional=True),
    S(("Decline came slowly, driven by {decline}.", "The long decline had several causes, chief among them "
       "{decline}."),
      ("Successive managers tried to adapt, and for a while {manager} kept the business alive by finding new "
       "customers abroad.",
       "{manager}, appointed manager in the difficult years, searched for new markets and cut costs wherever "
       "possible."),
      ("These efforts bought time but could not reverse the trend, and the workforce shrank year after year.",
       "The measures helped for a decade, but every year there were fewer jobs."),
      ("The {thing} finally closed in {closed}, and its buildings stood empty for a generation.",
       "When the end came in {closed}, the closure was felt in almost every household in {town}.")),
    S(("The closure left a deep mark on the town.", "The years after the closure were hard for {town}."),
      ("Shops on the main street lost trade, young people moved away to find work, and the empty buildings "
       "became a reminder of better times.",
       "Many families left, the population fell, and the old site was fenced off and gradually fell into "
       "disrepair."),
      ("Local historian {historian}, who interviewed dozens of former workers, describes this period as one of "
       "quiet grief rather than anger.",
       "In interviews collected by the historian {historian}, former workers speak more of loss of community "
       "than of lost wages."),
      optional=True),
    S(("Renewal began in {revived}, when a group of residents formed a trust to save what was left.",
       "Change came in {revived}, when residents set up a trust to rescue the surviving buildings."),
      ("After years of fundraising, the site now houses {revival}.",
       "Today the site is home to {revival}."),
      ("The project is small compared with the {thing} at its height, but it has brought visitors back and given "
       "the town a renewed sense of its own history.",
       "It employs only a handful of people, yet it has brought life back to the riverside and drawn visitors "
       "from across the region.")),
    S(("The story of the {thing} is not simply one of loss.", "It would be easy to tell this only as a story of "
       "decline."),
      ("It shaped the streets of {town}, the habits and skills of its people, and the way the town still "
       "thinks of itself.",
       "Yet the {thing} shaped the town's streets, its institutions and its sense of identity in ways that "
       "outlasted the business itself."),
      ("As {historian} puts it, the town did not lose its history when the {thing} closed; it simply had to "
       "learn to remember it differently.",
       "Its legacy, as one former worker told {historian}, is that people in {town} still know how to work "
       "together when something matters."),
      optional=True),
))
