"""A science news feature on a study: design, results, criticism and implications. All names, places and
figures are invented by the facts function."""
from __future__ import annotations

import random

from benchmarks.prompts.documents import Genre, S
from benchmarks.prompts.text import MONTHS, people, surname, towns

_STUDIES = (
    dict(question="whether a short afternoon nap improves how well older adults remember new information",
         subjects="adults aged sixty-five to eighty", intervention="a twenty-minute nap after lunch",
         control="a quiet rest without sleep", measure="recall of word lists and faces the following day",
         finding="the nap group remembered noticeably more", field="sleep research",
         caveat="participants knew which group they were in, which may have affected their motivation",
         use="care homes and day centres"),
    dict(question="how much street trees cool neighbourhoods during heatwaves",
         subjects="sixty streets in three cities", intervention="mature tree cover above thirty percent",
         control="similar streets with few or no trees", measure="surface and air temperatures at street level",
         finding="tree-lined streets were several degrees cooler in the afternoon", field="urban climate research",
         caveat="the study covered only one unusually hot summer", use="city planning and tree-planting budgets"),
    dict(question="whether children who grow up speaking two languages switch between tasks more easily",
         subjects="children aged seven to ten", intervention="daily use of two languages at home",
         control="children who speak one language at home", measure="speed and accuracy on task-switching games",
         finding="bilingual children switched slightly faster, but the difference was smaller than earlier studies "
         "suggested", field="developmental psychology",
         caveat="families who speak two languages differ from others in many ways besides language",
         use="advice given to parents and schools"),
    dict(question="how many microplastic particles reach rivers through treated wastewater",
         subjects="twelve treatment plants", intervention="advanced filtration added to the final stage",
         control="plants using conventional treatment", measure="particles per litre in the water released",
         finding="advanced filtration removed most particles but not the smallest fibres",
         field="environmental science", caveat="sampling took place only in dry weather",
         use="decisions about upgrading treatment plants"),
    dict(question="whether four-day working weeks change productivity in small firms",
         subjects="forty-one small companies", intervention="a four-day week with no cut in pay",
         control="the same firms' results in the previous year", measure="output per employee and sick days",
         finding="output held steady while sick days fell", field="labour economics",
         caveat="the firms volunteered, so they may have been unusually well suited to the change",
         use="employers considering shorter working weeks"),
    dict(question="whether reading aloud to hospital patients reduces their anxiety before surgery",
         subjects="patients waiting for planned operations", intervention="fifteen minutes of reading aloud by "
         "a volunteer", control="the usual waiting-room routine", measure="anxiety scores and heart rate",
         finding="anxiety scores fell more in the reading group", field="nursing research",
         caveat="the volunteers' friendliness may matter more than the reading itself",
         use="hospital volunteer programmes"),
    dict(question="whether a thirty kilometre speed limit reduces injuries on residential streets",
         subjects="residential streets in eight towns", intervention="a new thirty kilometre limit with signs "
         "and road markings", control="the old limit", measure="the number and severity of road injuries",
         finding="injuries fell by about a quarter where the lower limit applied", field="transport safety "
         "research", caveat="some towns also added speed bumps during the study, which makes the effects hard "
         "to separate", use="road safety policy in towns and cities"),
    dict(question="whether learning a musical instrument helps older adults stay mentally sharp",
         subjects="adults aged sixty to seventy-five with no musical training", intervention="weekly piano "
         "lessons and daily practice", control="weekly lessons in a subject unrelated to music",
         measure="scores on tests of memory and attention", finding="both groups improved, and the piano group "
         "improved slightly more on attention", field="research on ageing",
         caveat="the study lasted less than a year, so long-term effects remain unknown",
         use="activity programmes for older adults"),
    dict(question="whether free school breakfasts improve pupils' concentration",
         subjects="pupils in twenty-four primary schools", intervention="a free breakfast club before lessons",
         control="no breakfast club until the following year", measure="teacher ratings of concentration and "
         "reading test results", finding="concentration ratings improved, while reading results changed little "
         "in the first year", field="education research", caveat="teachers knew which schools had breakfast "
         "clubs, which could colour their ratings", use="school funding decisions"),
    dict(question="how much noise from a nearby motorway affects birdsong in a forest",
         subjects="forty recording sites at different distances from a motorway", intervention="recordings "
         "close to the road", control="recordings deep inside the forest", measure="the number of species heard "
         "and the pitch of their songs", finding="near the road fewer species sang, and some sang at a higher "
         "pitch", field="ecology", caveat="other differences between the sites, such as tree species, may also "
         "play a role", use="the planning of new roads and noise barriers"),
)


def _study_facts(rng: random.Random, topic: dict) -> dict:
    lead, co_author, critic, participant = people(rng, 4)
    uni, other_uni = towns(rng, 2)
    return dict(topic, lead=lead, lead_s=surname(lead), co_author=co_author,
                co_author_s=surname(co_author), critic=critic, critic_s=surname(critic), participant=participant,
                uni=f"the University of {uni}", other_uni=f"{other_uni} University", n=rng.randint(84, 2300),
                weeks=rng.randint(6, 52), effect=rng.randint(7, 31), years=rng.randint(2, 6),
                journal=rng.choice(("Applied Evidence", "Field Studies Quarterly", "Open Methods Review",
                                    "Population and Practice")), month=rng.choice(MONTHS),
                cost=f"{rng.randint(90, 900):,} thousand", dropout=rng.randint(4, 19))


STUDY = Genre("science news feature", "Study from {uni} asks {question}", _STUDIES, _study_facts, (
    S(("Researchers at {uni} have published the results of a study into {question}.",
       "A new study from {uni} set out to answer a simple-sounding question: {question}."),
      ("The work, which appeared in the journal {journal} in {month}, draws on {n} sets of measurements "
       "collected over {weeks} weeks.",
       "Published in {month} in {journal}, the study ran for {weeks} weeks and collected {n} sets of "
       "measurements."),
      ("Its main conclusion is that {finding}, though the authors are careful not to overstate the result.",
       "The headline result is that {finding}, but the team stresses that the findings need to be confirmed.")),
    S(("The project was led by {lead}, who has worked in {field} for more than fifteen years.",
       "{lead}, a specialist in {field}, led the research team."),
      ("{lead_s} said the idea came from years of hearing the same question from practitioners without finding "
       "a clear answer in the literature.",
       "According to {lead_s}, earlier studies had produced mixed results, partly because they were small and "
       "short."),
      ("The team wanted a design that would be large enough, and long enough, to settle the question one way or "
       "the other.",
       "The aim was to run a study big enough to give a reliable answer.")),
    S(("The question is not new.", "Scientists have debated the question for years."),
      ("Earlier studies in {field} produced contradictory answers, with some finding clear benefits and others "
       "finding none at all.",
       "Previous research gave mixed signals: a few small studies reported strong effects, while others found "
       "nothing."),
      ("Many of those studies were small, lasted only a few weeks or relied on people reporting their own "
       "experience, which is notoriously unreliable.",
       "Critics pointed out that most earlier work was short, small or based on self-reported data."),
      ("A review published {years} years ago concluded that the evidence was too weak to support any firm "
       "advice, and called for larger, better-controlled trials.",
       "A review of the evidence {years} years ago found it too weak for firm recommendations and called for "
       "better trials."),
      ("The new study was designed with those criticisms in mind.",
       "{lead_s} and colleagues designed their study to address exactly those weaknesses.")),
    S(("In practice, running the study was a considerable logistical effort.",
       "Day to day, the study demanded a great deal of organisation."),
      ("Research assistants collected the measurements on a fixed schedule, and a small team checked every "
       "value for errors before it entered the database.",
       "A team of assistants carried out the measurements, and every value was checked twice before analysis."),
      ("The researchers also held monthly meetings with an advisory group that included members of the public, "
       "who helped make the instructions clearer.",
       "An advisory panel that included members of the public reviewed the materials and suggested simpler "
       "wording."),
      optional=True),
    S(("The study covered {subjects}.", "The study focused on {subjects}."),
      ("One group had {intervention}, while a comparison group had {control}.",
       "Half were assigned to {intervention}; the other half, the comparison group, had {control}."),
      ("The researchers measured {measure} at the start, halfway through and at the end.",
       "The main outcome was {measure}, recorded at regular intervals."),
      ("Assignment to the groups was random, and the people analysing the data did not know which group each "
       "measurement came from.",
       "Groups were assigned at random, and the analysts were kept unaware of who was in which group.")),
    S(("On average, the difference between the groups was about {effect} percent.",
       "The researchers report an average difference of roughly {effect} percent between the groups."),
      ("That may sound modest, but {lead_s} argues that it is large enough to matter in practice.",
       "{lead_s} described the size of the effect as modest but meaningful."),
      ("The effect was larger in some cases than in others, and the team is now trying to understand why.",
       "The effect was not the same everywhere, and the reasons for the variation are not yet clear."),
      ("About {dropout} percent of the planned measurements could not be collected, a gap the authors consider "
       "acceptable.",
       "Roughly {dropout} percent of the planned measurements are missing, which the team took into account in "
       "the analysis.")),
    S(("{participant}, a volunteer who helped collect the data, said the work had been easier than expected.",
       "For {participant}, who volunteered on the project, the most surprising thing was how quickly the "
       "routine became normal."),
      ("Each round of measurements took little time, and the research staff explained every step clearly.",
       "Volunteers were trained in a single afternoon, and the staff were patient with questions."),
      ("Many of those involved asked to be told the results, and the team plans to publish a plain-language "
       "summary.",
       "The team has promised a plain-language summary of the findings to everyone who helped."),
      optional=True),
    S(("Not everyone is convinced.", "Other researchers have welcomed the study while pointing to its limits."),
      ("{critic}, who works in the same field at {other_uni} but was not involved, said the main weakness is that "
       "{caveat}.",
       "{critic} of {other_uni}, who was not part of the team, noted that {caveat}."),
      ("{critic_s} also pointed out that a single study, however well designed, should not change practice on its "
       "own.",
       "According to {critic_s}, the results are promising but need to be repeated by an independent group."),
      ("The authors accept these points and list them in their paper.",
       "{lead_s} agreed with the criticism and said a second study is already being planned.")),
    S(("The study cost about {cost} and was funded by a public research council.",
       "Funding of around {cost} came from a public research council; no commercial sponsor was involved."),
      ("All data and analysis code have been made available to other researchers, which is still far from "
       "standard practice.",
       "The team has shared its data and code so that others can check the analysis."),
      ("{co_author}, a statistician on the team, said openness was the best answer to doubts about the "
       "results.",
       "{co_author_s}, who led the statistical work, said sharing the data was essential for trust."),
      optional=True),
    S(("If the findings hold up, they could influence {use}.",
       "The practical implications are potentially significant for {use}."),
      ("But {lead_s} warns against rushing: the next step is a larger study over {years} years, in more varied "
       "settings.",
       "{lead_s} hopes to begin a follow-up study lasting {years} years, in more varied settings."),
      ("For now, the advice from the team is cautious: the evidence is encouraging, but it is not yet the final "
       "word.",
       "Until then, the team says, the results should be seen as a strong hint rather than proof.")),
))
