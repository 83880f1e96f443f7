"""nbgrader configuration of the course: one assignment per chapter.

``solutions/NN_slug/`` is the source (complete notebooks with solution regions and hidden
tests); ``chapters/NN_slug/`` is the release the students get. ``make chapters`` runs
``nbgrader generate_assignment`` with this file; instructors use it to collect and grade.
"""

c = get_config()  # noqa: F821 - nbgrader provides get_config when it loads this file

c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "chapters"
c.CourseDirectory.submitted_directory = "submitted"
c.CourseDirectory.autograded_directory = "autograded"
c.CourseDirectory.feedback_directory = "feedback"
c.CourseDirectory.notebook_id = "*"

# autograde runs no cell of a submission: nbgrader's Execute step, which would run every cell in a
# kernel as the instructor (with the instructor's files and environment), is replaced by one that
# grades each answer in the course's sandbox and writes its feedback and points as the graded cell's
# outputs; the other cells have none, and the feedback says why at its top. Test cells are compared
# with the cells as released (without their hidden tests), so an untouched one raises no tampering
# warning. `nbgrader validate` still runs every cell in a kernel: a student's check of their own
# notebook, never to be run on a submission.
import warnings  # noqa: E402

from sqlalchemy.exc import SAWarning  # noqa: E402

from autograder.nbgrader_plugin import (  # noqa: E402
    autograde_preprocessors,
    feedback_preprocessors,
    sanitize_preprocessors,
)

c.Autograde.autograde_preprocessors = autograde_preprocessors()
# Chapter 12's trained weights are the student's: autograde must not replace them by the solution's.
c.Autograde.exclude_overwriting = {"12_capstone": ["my_model/model.safetensors"]}
c.Autograde.sanitize_preprocessors = sanitize_preprocessors()
c.GenerateFeedback.preprocessors = feedback_preprocessors()

# nbgrader 0.9's gradebook adds submissions through backrefs that SQLAlchemy 2 no longer
# cascades; it adds them itself right after, so these notices say nothing to an instructor.
warnings.filterwarnings("ignore", message=r"Object of type <\w+> not in session", category=SAWarning)
