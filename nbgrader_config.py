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

# The graded cells call the course's own grader, which runs each answer in a sandboxed worker.
c.ExecutePreprocessor.timeout = 300

# The graded cells' outputs are recomputed outside the student's kernel after execution, so a
# notebook that patches the grader inside its kernel cannot change its points. Test cells are
# compared with the cells as released (without their hidden tests), so an untouched one raises
# no tampering warning.
import warnings  # noqa: E402

from sqlalchemy.exc import SAWarning  # noqa: E402

from autograder.nbgrader_plugin import autograde_preprocessors, sanitize_preprocessors  # noqa: E402

c.Autograde.autograde_preprocessors = autograde_preprocessors()
# Chapter 12's trained weights are the student's: autograde must not replace them by the solution's.
c.Autograde.exclude_overwriting = {"12_capstone": ["my_model/model.safetensors"]}
c.Autograde.sanitize_preprocessors = sanitize_preprocessors()

# nbgrader 0.9's gradebook adds submissions through backrefs that SQLAlchemy 2 no longer
# cascades; it adds them itself right after, so these notices say nothing to an instructor.
warnings.filterwarnings("ignore", message=r"Object of type <\w+> not in session", category=SAWarning)
