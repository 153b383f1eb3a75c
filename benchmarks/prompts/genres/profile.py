"""A profile of a person's career: childhood, training, breakthrough, setbacks, legacy. All names, places and
figures are invented by the facts function."""
from __future__ import annotations

import random

from benchmarks.prompts.documents import Genre, S
from benchmarks.prompts.text import people, surname, towns

_CAREERS = (
    dict(craft="architect", work="schools, libraries and small public buildings", start="drawing plans for "
         "garden sheds in a relative's workshop", big_break="winning a competition to design a village school",
         signature="buildings that let daylight reach every room", setback="a celebrated concert hall whose "
         "roof leaked in its first winter", students="apprentices"),
    dict(craft="pastry chef", work="bread and pastries built on regional grains", start="helping in a bakery "
         "before school", big_break="taking over a failing bakery and turning it around within a year",
         signature="recipes that use forgotten local wheat varieties", setback="a second shop that closed "
         "after eighteen months", students="young bakers"),
    dict(craft="marine biologist", work="research on the recovery of damaged seagrass meadows",
         start="collecting shells and keeping notebooks about tide pools", big_break="a long-term survey that "
         "showed how quickly seagrass can return when boats stop anchoring on it",
         signature="studies that involve local fishers as partners", setback="years of funding cuts that "
         "nearly ended the survey", students="doctoral students"),
    dict(craft="violin maker", work="string instruments for orchestras and students",
         start="repairing a broken violin found in an attic", big_break="an instrument played at a major "
         "international competition", signature="instruments made from wood salvaged from old buildings",
         setback="a workshop fire that destroyed a year of work", students="apprentices"),
    dict(craft="software engineer", work="tools that help small charities manage volunteers and donations",
         start="writing simple games on a borrowed computer", big_break="an open-source project adopted by "
         "hundreds of charities", signature="software designed for people with little technical training",
         setback="a start-up that ran out of money", students="junior developers"),
    dict(craft="documentary photographer", work="long-term projects about working life in small towns",
         start="taking pictures of neighbours with a second-hand camera", big_break="a photo essay on a closing "
         "shipyard that toured several countries", signature="portraits made over many years of the same "
         "people", setback="a publisher's collapse that left a finished book unpublished", students="young "
         "photographers"),
    dict(craft="landscape gardener", work="public parks and school grounds", start="growing vegetables on a "
         "balcony", big_break="the redesign of a neglected city square that became a national example",
         signature="gardens planted for wildlife as much as for people", setback="a drought that killed most "
         "of the plants in a flagship project", students="young gardeners"),
    dict(craft="literary translator", work="novels translated from Korean and Japanese into English",
         start="reading comics in languages nobody at home could read", big_break="a translation that won a "
         "major literary prize", signature="translations that keep the rhythm of the original sentences",
         setback="a publisher cancelling a contract halfway through a long novel", students="young "
         "translators"),
    dict(craft="furniture maker", work="chairs and tables built to last for generations",
         start="taking apart old radios and furniture to see how they were made", big_break="a commission to "
         "furnish a new parliament building", signature="joints made without glue or screws",
         setback="a flood that ruined the workshop and its stock of seasoned timber", students="apprentices"),
    dict(craft="radio producer", work="documentaries about everyday working lives", start="recording "
         "interviews with neighbours on a cassette recorder", big_break="a series about night workers that won "
         "a national award", signature="programmes in which ordinary people tell their stories in their own "
         "words", setback="the closure of the station that had broadcast the work for fifteen years",
         students="young producers"),
)


def _profile_facts(rng: random.Random, topic: dict) -> dict:
    subject, mentor, colleague, friend = people(rng, 4)
    home, city = towns(rng, 2)
    born = rng.randint(1948, 1986)
    return dict(topic, subject=subject, s=surname(subject), mentor=mentor, mentor_s=surname(mentor),
                colleague=colleague, friend=friend, home=home, city=city, born=born,
                break_year=born + rng.randint(24, 34), setback_year=born + rng.randint(36, 44),
                award_year=born + rng.randint(45, 55), siblings=rng.choice(("two", "three", "four")),
                count=rng.randint(14, 120))


PROFILE = Genre("profile of a person's career", "{subject}: a profile", _CAREERS, _profile_facts, (
    S(("{subject} has spent more than three decades as a {craft}, and in that time has quietly changed how many "
       "people think about {work}.",
       "Ask colleagues about {subject} and the same words keep coming up: patient, stubborn and generous."),
      ("Born in {home} in {born}, {s} was the youngest of {siblings} children in a family with no connection to "
       "the profession.",
       "{s} grew up in {home}, born in {born} as the youngest of {siblings} children, with no family tradition "
       "to follow."),
      ("This profile draws on conversations with {s}, former colleagues and friends.",
       "What follows is based on interviews with {s} and with people who have worked alongside the {craft} "
       "over the years.")),
    S(("The interest started early, with {start}.", "Looking back, {s} traces everything to childhood and to "
       "{start}."),
      ("A teacher noticed the talent and encouraged {s} to keep going, even when the family worried about money.",
       "At school a teacher spotted the talent and persuaded the family that it was worth pursuing."),
      ("{friend}, a childhood friend, remembers that {s} could spend whole afternoons absorbed in a single task.",
       "According to {friend}, who has known {s} since they were both eight, the focus was obvious even then.")),
    S(("Training was slow and demanding.", "The early years of training were hard."),
      ("The most important influence was {mentor}, a demanding teacher who rarely gave praise.",
       "{s} learned the craft under {mentor}, whose standards were famously high."),
      ("{mentor_s} insisted that every piece of work be done again until it was right, a habit {s} still "
       "follows.",
       "From {mentor_s} came the conviction that shortcuts always show in the finished work."),
      ("Money was tight, and {s} took evening jobs to pay the rent in {city}.",
       "To make ends meet in {city}, {s} worked evenings and weekends for several years.")),
    S(("The breakthrough came in {break_year}, with {big_break}.", "In {break_year}, {big_break} changed "
       "everything."),
      ("Suddenly there was more work than one person could handle, and {s} had to learn to say no.",
       "Offers arrived from places that had ignored {s} only a year earlier."),
      ("It was also the moment when the ideas that define the career came together.",
       "Friends say the success changed the workload but not the person.")),
    S(("The work of {s} is recognisable for {signature}.",
       "If there is a single thread running through the career, it is {signature}."),
      ("{colleague}, who worked alongside {s} for many years, says the approach is less about style than about "
       "respect for the people who will use the work.",
       "As {colleague}, a long-time collaborator, puts it, the point was never to impress other professionals "
       "but to serve ordinary people well."),
      ("Over the years this has produced more than {count} finished works, many of them still in daily use.",
       "The results, some {count} completed projects, are scattered across the region.")),
    S(("Colleagues describe a working method that has barely changed in thirty years.",
       "The working routine of {s} is famously consistent."),
      ("The day starts early, with an hour of planning before anyone else arrives, and ends with a walk to think "
       "through problems that have not been solved.",
       "Mornings are for the most demanding work; afternoons are for meetings, correspondence and teaching."),
      ("Every project begins with a notebook of sketches and questions, and {s} has kept every one of them, more "
       "than a hundred in all.",
       "Each job starts in a paper notebook, a habit inherited from {mentor_s}, and the notebooks now fill a "
       "whole shelf."),
      ("{colleague} says the most striking habit is listening: {s} asks questions for a long time before "
       "offering any opinion.",
       "What surprises newcomers, according to {colleague}, is how much time {s} spends asking questions before "
       "deciding anything.")),
    S(("Outside work, life is deliberately quiet.", "Away from work, {s} leads a simple life."),
      ("{s} still lives in {city}, in a house within walking distance of the workshop, and spends weekends "
       "gardening or walking in the hills.",
       "Home is a small house in {city}, and free time goes on long walks, gardening and reading history."),
      ("Friends describe a dry sense of humour and a habit of remembering everyone's birthday.",
       "{friend} says the public image of a serious professional hides a warm and funny friend."),
      ("{s} has never owned a television and says boredom is underrated as a source of ideas.",
       "A dislike of phones and screens is well known, and {s} answers letters by hand.")),
    S(("Not everything went well.", "The career has had its failures, and {s} talks about them openly."),
      ("The hardest period came around {setback_year}, with {setback}.",
       "Around {setback_year} came {setback}, a blow that led {s} to consider giving up."),
      ("Instead, {s} took a year to reflect, changed how the business was run and came back with fewer projects "
       "and more care.",
       "The recovery was slow, but {s} says the experience taught more than any success."),
      optional=True),
    S(("Teaching has become as important to {s} as the work itself.",
       "In recent years much of the energy has gone into teaching."),
      ("{s} has trained dozens of {students}, and several now run their own practices.",
       "Dozens of {students} have learned from {s}, many of whom speak of the experience with gratitude."),
      ("The teaching style echoes {mentor_s}'s, though {s} admits to being gentler.",
       "Former students describe lessons that were demanding but always fair."),
      optional=True),
    S(("Younger people in the profession often cite {s} as an influence.",
       "The influence of {s} reaches well beyond the finished work."),
      ("Ideas that once seemed eccentric, such as {signature}, are now taught as good practice.",
       "What was once considered an odd personal preference, {signature}, has become something many younger "
       "practitioners aim for."),
      ("{s} is uncomfortable with the word legacy and prefers to talk about the people who commissioned the work "
       "and the people who use it.",
       "Asked about influence, {s} changes the subject to the clients and collaborators who made the work "
       "possible."),
      ("Still, critics agree that the profession in this part of the country would look different without "
       "{s}.",
       "Even so, few would dispute that the field looks different because of {s}.")),
    S(("Recognition came late; a national award followed in {award_year}.",
       "In {award_year} the profession finally gave {s} its highest award."),
      ("{s} accepted it with a short speech that thanked {mentor_s} and the many clients who had taken a risk "
       "on an unknown name.",
       "In a brief acceptance speech, {s} thanked {mentor_s} and the people who had trusted an unknown name "
       "early on."),
      ("Asked what comes next, {s} says there is no plan to retire, only a plan to slow down a little.",
       "Retirement, {s} says, is not on the agenda; the plan is simply to work more slowly and choose projects "
       "with more care.")),
))
