"""A local news report: the council approves a contested public project. All names, places and figures are
invented by the facts function."""
from __future__ import annotations

import random

from benchmarks.prompts.documents import Genre, S
from benchmarks.prompts.text import MONTHS, WEEKDAYS, people, surname, towns

_PROJECTS = (
    dict(project="a network of protected bike lanes", short="the bike lane network",
         problem="cycling injuries at four central junctions had doubled in three years",
         benefit="fewer collisions at busy junctions and a safe route for children cycling to school",
         concern="the loss of on-street parking along the main shopping street",
         work="repaint junctions, install kerb separators and retime traffic signals",
         fans="parents' groups and the local cycling club", critics="several shop owners on the high street"),
    dict(project="a flood barrier along the river embankment", short="the flood barrier",
         problem="the river had burst its banks twice in a decade and flooded hundreds of homes",
         benefit="protection for the low-lying streets that were flooded in both recent storms",
         concern="a tall wall cutting the town off from its riverside promenade",
         work="drive steel piles along the embankment and raise the footpath behind them",
         fans="residents of the riverside streets", critics="a heritage society that wants to protect the old quay"),
    dict(project="an extension of the tram line to the eastern estates", short="the tram extension",
         problem="bus journeys from the eastern estates to the centre regularly took more than forty minutes",
         benefit="a direct and reliable link between the eastern estates, the hospital and the station",
         concern="two years of road closures on the busiest route into town",
         work="lay new track, move underground cables and build six new stops",
         fans="commuters from the eastern estates and the college's student union",
         critics="taxi drivers and residents living near the proposed depot"),
    dict(project="a full renovation of the central library", short="the library renovation",
         problem="the library roof leaked, its lifts failed regularly and visitor numbers had fallen by a third",
         benefit="a modern building with study rooms, a makerspace and longer opening hours",
         concern="the library closing for eighteen months while services move to a temporary site",
         work="replace the roof, install new lifts and open up the ground floor",
         fans="teachers, students and the local writers' circle",
         critics="ratepayers who argue the money should go to road repairs"),
    dict(project="a district heating network fed by a new heat pump plant", short="the heating network",
         problem="most homes in the old town still relied on gas boilers more than twenty years old",
         benefit="lower heating bills and a large cut in the town's carbon emissions",
         concern="streets being dug up for pipes and uncertainty over future heating prices",
         work="build the pump station, lay insulated pipes and connect the first public buildings",
         fans="climate campaigners and the housing association",
         critics="households worried about being tied to a single supplier"),
    dict(project="the restoration of the old covered market hall", short="the market hall restoration",
         problem="the market hall had stood empty since its cast-iron roof was declared unsafe",
         benefit="a covered market for local producers and a venue for events all year round",
         concern="rents for traders rising sharply once the restored hall reopens",
         work="repair the ironwork, replace the glazing and install new stalls and drainage",
         fans="local food producers and the chamber of commerce",
         critics="current street traders who fear they will be priced out"),
    dict(project="a new secondary school on the former hospital site", short="the new school",
         problem="classes at the two existing schools had grown to more than thirty-five pupils",
         benefit="smaller classes and an end to long bus journeys for children from the northern villages",
         concern="heavy traffic in the narrow lanes around the site at the start and end of the school day",
         work="demolish the old hospital wards, build the main teaching block and lay out playing fields",
         fans="parents of young children and the teachers' union", critics="neighbours of the old hospital site"),
    dict(project="a car-free zone covering the old town centre", short="the car-free zone",
         problem="air pollution in the old town regularly exceeded national limits",
         benefit="cleaner air, quieter streets and more space for cafés and markets",
         concern="deliveries, access for disabled drivers and the survival of small shops",
         work="install retractable bollards, widen pavements and create loading bays at the edges",
         fans="residents of the old town and a coalition of health charities",
         critics="some traders and people who live in outlying villages"),
    dict(project="a solar farm on the closed landfill north of town", short="the solar farm",
         problem="the town's electricity bills had risen by half in three years",
         benefit="cheaper power for public buildings and income from selling surplus electricity",
         concern="glare, new fencing and the loss of a popular dog-walking area",
         work="lay foundations that do not pierce the landfill cap, mount the panels and connect them to the grid",
         fans="the town's energy cooperative and local environmental groups",
         critics="dog walkers and residents whose houses overlook the site"),
    dict(project="a new swimming pool to replace the one closed five years ago", short="the new pool",
         problem="hundreds of children were leaving primary school unable to swim",
         benefit="swimming lessons for every primary school pupil and a place for clubs to train",
         concern="the running costs the council will have to cover every year",
         work="clear the old site, build the pool hall and install a heat recovery system",
         fans="swimming clubs, schools and older residents who swim for their health",
         critics="councillors worried about long-term running costs"),
)


def _news_facts(rng: random.Random, topic: dict) -> dict:
    mayor, critic, engineer, resident = people(rng, 4)
    city, neighbour = towns(rng, 2)
    votes_for = rng.randint(7, 12)
    return dict(topic, city=city, neighbour=neighbour, mayor=mayor, mayor_s=surname(mayor),
                critic=critic, critic_s=surname(critic), engineer=engineer, resident=resident,
                votes_for=votes_for, votes_against=rng.randint(2, votes_for - 3),
                budget=f"{rng.uniform(4, 40):.1f}", grant_share=rng.randrange(35, 71, 5),
                weekday=rng.choice(WEEKDAYS), start_month=rng.choice(MONTHS), end_year=rng.randint(2027, 2031),
                origin_year=rng.randint(2014, 2022), debate_months=rng.randint(7, 30),
                speakers=rng.randint(19, 86), petition=f"{rng.randint(800, 4200):,}",
                neighbour_years=rng.randint(3, 9))


NEWS = Genre("local news report", "Council in {city} backs {short} after {debate_months}-month debate", _PROJECTS,
             _news_facts, (
    S(("The {city} town council voted {votes_for} to {votes_against} on {weekday} evening to approve {project}, "
       "ending a debate that had divided residents for {debate_months} months.",
       "After {debate_months} months of public argument, councillors in {city} approved {project} on "
       "{weekday} night by {votes_for} votes to {votes_against}."),
      ("The scheme is expected to cost {budget} million, and officials say about {grant_share} percent of that "
       "will come from a regional infrastructure grant.",
       "Officials put the cost at {budget} million, of which roughly {grant_share} percent is to be covered by a "
       "regional grant and the rest by municipal borrowing."),
      ("Construction is scheduled to begin in {start_month} and to be finished by the end of {end_year}.",
       "If the current timetable holds, work will start in {start_month} and the final phase will be completed "
       "in {end_year}.")),
    S(("The proposal dates back to {origin_year}, when a council review found that {problem}.",
       "The idea was first raised in {origin_year} after a council review concluded that {problem}."),
      ("Since then the plan has been redrawn several times, shrinking in some versions and growing in others as "
       "costs and priorities changed.",
       "Over the following years it went through several drafts, each shaped by new cost estimates and by the "
       "priorities of successive councils."),
      ("Mayor {mayor}, who made {short} a central promise of the last election campaign, called the vote a "
       "turning point for the town.",
       "Mayor {mayor} had campaigned on {short} at the last election and described the result as a turning "
       "point."),
      "Supporters say the town has talked about the problem for years without acting on it."),
    S(("Backers of the plan, including {fans}, argue that it will bring {benefit}.",
       "Among its strongest supporters are {fans}, who say the scheme will deliver {benefit}."),
      ("At the meeting, {resident}, who has lived in {city} for more than thirty years, told councillors that "
       "the town could not afford another decade of delay.",
       "{resident}, a resident of {city} for more than thirty years, told the meeting that every year of delay "
       "made the eventual work more expensive."),
      ("Council engineers presented figures suggesting that long-term savings would cover a large share of the "
       "initial cost.",
       "A report by council engineers estimated that lower maintenance costs would offset a substantial part "
       "of the investment over twenty-five years."),
      "Supporters also noted that the regional grant is only available for projects that start before the end "
      "of next year."),
    S(("Opposition has come mainly from {critics}, whose chief worry is {concern}.",
       "The loudest objections have come from {critics}, who are concerned above all about {concern}."),
      ("{critic}, who spoke on behalf of the objectors, said the council had not taken their concerns seriously "
       "and had rushed the final stage of consultation.",
       "Speaking for the objectors, {critic} accused the council of treating the consultation as a formality "
       "and ignoring the people most affected."),
      ("A petition against the plan gathered {petition} signatures, a large number for a town of its size.",
       "Objectors handed in a petition with {petition} signatures shortly before the vote."),
      ("Several councillors who voted against the scheme said they supported its aims but doubted the cost "
       "estimates.",
       "The {votes_against} councillors who voted against said they were not opposed in principle but did not "
       "trust the budget.")),
    S(("The meeting itself lasted more than four hours, and {speakers} members of the public signed up to speak.",
       "{speakers} residents registered to address the council, and the session ran well past midnight."),
      "Many speakers brought photographs, letters and hand-drawn maps to make their case.",
      ("At one point the chair had to call a short break after shouting broke out in the public gallery.",
       "The debate was heated at times, and the chair twice reminded the gallery to let speakers finish."),
      "When the vote was finally taken, supporters in the gallery applauded while several objectors walked out.",
      optional=True),
    S("The financial details produced some of the sharpest exchanges of the evening.",
      ("The council's finance officer confirmed that borrowing for the scheme would add to annual repayments but "
       "said the increase was manageable within existing limits.",
       "According to the finance officer, the borrowing would raise annual debt repayments slightly but stay "
       "within the limits agreed with the regional authority."),
      ("Critics pointed out that similar projects elsewhere had run over budget by a third or more, and asked "
       "what would happen if costs rose.",
       "Opponents asked what would happen if prices for materials and labour kept rising, noting that comparable "
       "projects had overrun by a third."),
      "In response, officials said the contract would include a fixed-price element and a contingency fund of "
      "about ten percent.",
      optional=True),
    S(("The work will be carried out in three phases, during which contractors will {work}.",
       "Contractors will {work}, working in three phases to limit disruption."),
      ("Chief engineer {engineer} said the most disruptive phase would be scheduled for the summer months, when "
       "traffic is usually lighter.",
       "According to chief engineer {engineer}, the noisiest work will take place in summer, when schools are "
       "closed and traffic is lighter."),
      ("Residents and businesses along the route will receive letters at least six weeks before work starts near "
       "them.",
       "The council has promised written notice to affected households and businesses at least six weeks before "
       "work begins nearby."),
      "A public information desk will open in the town hall to answer questions throughout construction."),
    S(("Supporters often point to neighbouring {neighbour}, which completed a similar project {neighbour_years} "
       "years ago.",
       "Both sides cited the example of nearby {neighbour}, where a comparable scheme was finished "
       "{neighbour_years} years ago."),
      ("There, early complaints faded once the work was done, and surveys now show broad satisfaction.",
       "In {neighbour} the first months were difficult, but local surveys now suggest that most residents regard "
       "the project as a success."),
      "Objectors reply that {neighbour} is a larger town with a different layout, and that its experience may "
      "not apply to {city}.",
      optional=True),
    S(("The next step is a tender for the main construction contract, which the council expects to award within "
       "six months.",
       "The council will now open a tender for the main contract and hopes to choose a builder within six "
       "months."),
      ("A steering group of councillors, officers and residents will oversee the project and report to the full "
       "council every quarter.",
       "Progress will be monitored by a steering group that includes two residents' representatives and reports "
       "to the council each quarter."),
      ("Objectors have not ruled out asking a court to review the decision.",
       "{critic_s} said the objectors were taking legal advice and had not ruled out a challenge in the "
       "courts.")),
    S(("Leaving the chamber, Mayor {mayor_s} said the town had made a decision that people would judge in twenty "
       "years rather than twenty days.",
       "Asked about the divisions the debate had exposed, Mayor {mayor_s} said the council would keep listening "
       "as the work goes ahead."),
      ("For many residents, the question now is less whether {short} will be built than whether it can be built "
       "on time and on budget.",
       "For most people in {city}, attention will now turn to whether the project can be delivered on time and "
       "on budget."),
      optional=True),
))
